"""``wurk workflows [list | show ID] [--limit N]``.

Duties:
1. ``list`` (the default): the newest workflows of the index (at most
   ``--limit``), each with its state; one whose keys expired shows
   ``expired``.
2. ``show ID``: one workflow: state, policy, each step with its state, job
   count, batch and error, and the stored results of its last steps. Exit 1
   when the workflow has no record (never made, or expired).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from wurk.admin.output import clip, fields, printable, table, when
from wurk.admin.registry import AdminCommand, Context, UsageError, limit_type
from wurk.push.client import Client
from wurk.workflows.spec import WorkflowError
from wurk.workflows.status import read, recent

Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                        help="what to do (default: list)")
    parser.add_argument("wid", nargs="?", metavar="ID", help="the workflow id (for show)")
    parser.add_argument("--limit", type=limit_type(), default=100,
                        help="list at most this many workflows (default 100)")


def run(ctx: Context, args: argparse.Namespace) -> int | None:
    client = Client(ctx.config, drain_spool=False)
    if args.action == "list":
        found = recent(client, max(1, args.limit))
        ctx.emit({"workflows": [{"wid": wid, "state": state} for wid, state in found]},
                 render_list)
        return None
    if not args.wid:
        raise UsageError("usage: wurk workflows show ID")
    try:
        status = read(client, args.wid)
    except WorkflowError as exc:
        ctx.emit({"workflow": None, "wid": args.wid, "error": str(exc)}, render_show)
        return 1
    shown = asdict(status)
    shown["steps"] = list(shown["steps"].values())
    ctx.emit({"workflow": shown, "wid": args.wid}, render_show)
    return None


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(w["wid"], w["state"]) for w in payload["workflows"]]
    return table(("ID", "STATE"), rows, empty="no workflows")


def render_show(payload: Payload, now: float) -> list[str]:
    w = payload["workflow"]
    if w is None:
        return [f"workflow {payload['wid']}: {payload['error']}"]
    lines = fields([
        ("id", w["wid"]), ("state", w["state"]), ("policy", w["policy"]),
        ("description", printable(w["description"]) or "-"),
        ("created", when(w["created_at"], now)),
        ("finished", when(w["finished_at"], now) if w["finished_at"] else "-"),
        ("stopped by", w["stopped_by"] or "-"),
    ])
    for step in w["steps"]:
        error = step["error"] or {}
        problem = f"  {error.get('class')}: {clip(printable(str(error.get('message'))))}" \
            if error else ""
        lines.append(f"  {printable(step['name'])} [{step['job']} x{step['jobs']}]: "
                     f"{step['state']}{problem}")
    lines.extend(f"  result of {printable(name)}: {clip(printable(repr(value)))}"
                 for name, value in w["results"].items())
    return lines


COMMANDS = (AdminCommand("workflows", "list workflows, or show one with its steps", run,
                         arguments),)

"""``wurk cancel JID [--kill]``: cancel one job, waiting or running, on any host.

Duties:
1. Cancel the job through :func:`wurk.api.cancel`: one waiting in a queue,
   the schedule or the retry set never runs; one running gets
   ``wurk.JobCancelled`` within about a second, from its own process.
2. ``--kill``: a running job's process also recycles, as at a hard timeout
   (for a job stuck in C code that no exception reaches).
3. Print where the job was (``{"jid", "state", "where"}`` with ``--json``);
   a jid found nowhere fails with one line and exit 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.admin.registry import AdminCommand, Context
from wurk.api.cancelling import RUNNING, cancel

Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jid", help="the job's jid")
    parser.add_argument("--kill", action="store_true",
                        help="a running job's process recycles too (a job stuck in C code)")


def run(ctx: Context, args: argparse.Namespace) -> None:
    found = cancel(args.jid, kill=args.kill, config=ctx.config)
    ctx.emit({"jid": found.jid, "state": found.state, "where": found.where}, render)


def render(payload: Payload, now: float) -> list[str]:
    jid, where = payload["jid"], payload["where"]
    if payload["state"] == RUNNING:
        return [f"{jid}: running on {where}: asked to stop (it stops within about a second)"]
    place = {"queued": f"queue {where!r}", "scheduled": "the schedule",
             "retry": "the retry set"}[payload["state"]]
    return [f"{jid}: cancelled: removed from {place}; it will not run"]


COMMANDS = (AdminCommand("cancel", "cancel a job by jid, waiting or running", run, arguments),)

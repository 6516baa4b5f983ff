"""``wurk limiters [list | reset NAME]``: the cluster's rate and concurrency limiters.

Duties:
1. ``list`` (the default): every limiter registered in ``lmtr-list`` (wurk's
   and Sidekiq Enterprise's), with its kind, limit and what is in use now;
   a limiter whose state cannot be read shows its error instead of failing
   the listing.
2. ``reset NAME``: delete the limiter's state so it starts empty (the cure
   for a key that holds garbage), keeping it registered; asks first, or
   takes ``--yes``.
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.admin.output import table
from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError
from wurk.api.limiters import LimiterSet, UnknownLimiterError

Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("list", "reset"), default="list",
                        help="what to do (default: list)")
    parser.add_argument("name", nargs="?", help="the limiter to reset")
    parser.add_argument("--yes", action="store_true", help="reset without asking")


def run(ctx: Context, args: argparse.Namespace) -> None:
    limiters = LimiterSet(config=ctx.config)
    if args.action == "list":
        if args.name:
            raise UsageError("usage: wurk limiters [list | reset NAME]")
        ctx.emit({"limiters": [info.as_dict() for info in limiters]}, render_list)
        return
    if not args.name:
        raise UsageError("usage: wurk limiters reset NAME")
    if not args.yes:
        ctx.confirm(f"Reset limiter {args.name!r} (drop its holders and counts)?",
                    what="resetting a limiter drops its holders and counts")
    try:
        deleted = limiters.reset(args.name)
    except (UnknownLimiterError, KeyError, TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    ctx.emit({"name": args.name, "reset": True, "keys_deleted": deleted},
             lambda payload, now: [f"reset limiter {payload['name']} "
                                   f"({payload['keys_deleted']} keys deleted)"])


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [_row(entry) for entry in payload["limiters"]]
    return table(("NAME", "KIND", "LIMIT", "USED", "PER", "NOTES"), rows,
                 empty="no limiters (a limiter registers at its first check)")


def _row(entry: Payload) -> tuple[Any, ...]:
    if entry["error"]:
        return (entry["name"], "?", "", "", "", entry["error"])
    options = entry["options"]
    per = options.get("interval", options.get("drain", ""))
    notes = f"lease {options['lock_timeout']}s" if entry["kind"] == "concurrent" else ""
    if entry["reclaimed"]:
        notes += f", {entry['reclaimed']} reclaimed"
    if entry["overages"]:
        notes += f", {entry['overages']} overages"
    return (entry["name"], entry["kind"], entry["limit"], entry["used"],
            f"{per}s" if per != "" else "", notes)


COMMANDS = (AdminCommand("limiters", "list the rate and concurrency limiters, or reset one",
                         run, arguments),)

"""``wurk periodic [list | pause NAME | unpause NAME | history NAME]``: periodic entries.

Duties:
1. ``list`` (the default): every entry registered in Redis with its
   schedule, zone, job, queue, pause flag, last fire and next run.
2. ``pause NAME`` / ``unpause NAME``: set the entry's pause flag, which the
   leading process honours at its next pass (an unpause does not run the
   ticks that fell during the pause).
3. ``history NAME``: the entry's latest fires (``[fired_at, jid]``, newest
   first) and its next run times.
4. An unknown name is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.admin.output import table, when
from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError
from wurk.api.periodic import PeriodicSet, UnknownPeriodicError

ACTIONS = ("list", "pause", "unpause", "history")
NEXT_RUNS = 5
Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                        help="what to do (default: list)")
    parser.add_argument("name", nargs="?", help="a periodic entry's name (pause, unpause, "
                                                "history)")


def run(ctx: Context, args: argparse.Namespace) -> None:
    entries = PeriodicSet(config=ctx.config)
    if (args.action == "list") != (args.name is None):
        usage = "periodic list" if args.action == "list" else f"periodic {args.action} NAME"
        raise UsageError(f"usage: wurk {usage}")
    try:
        {"list": do_list, "pause": do_pause, "unpause": do_pause,
         "history": do_history}[args.action](ctx, entries, args)
    except UnknownPeriodicError as exc:
        raise CommandError(str(exc)) from None


def do_list(ctx: Context, entries: PeriodicSet, args: argparse.Namespace) -> None:
    ctx.emit({"periodic": [info.to_dict() for info in entries.all(ctx.now)]}, render_list)


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(p["name"], p["schedule"], p["tz"], p["job"], p["queue"],
             "paused" if p["paused"] else "active",
             when(p["last_fired_at"], now), when(p["next_run"], now))
            for p in payload["periodic"]]
    return table(("NAME", "SCHEDULE", "TZ", "JOB", "QUEUE", "STATE", "LAST", "NEXT"), rows,
                 empty="no periodic entries (declare them with wurk.periodic(...) or "
                       "[[periodic]] and start a process)")


def do_pause(ctx: Context, entries: PeriodicSet, args: argparse.Namespace) -> None:
    if args.action == "pause":
        entries.pause(args.name)
    else:
        entries.unpause(args.name, now=ctx.now)
    ctx.emit({"name": args.name, "paused": args.action == "pause"},
             lambda p, now: [f"{p['name']}: {'paused' if p['paused'] else 'unpaused'}"])


def do_history(ctx: Context, entries: PeriodicSet, args: argparse.Namespace) -> None:
    runs = entries.history(args.name)
    upcoming = entries.next_runs(args.name, NEXT_RUNS, now=ctx.now)
    ctx.emit({"name": args.name, "history": [{"fired_at": r.fired_at, "jid": r.jid}
                                             for r in runs],
              "next_runs": upcoming}, render_history)


def render_history(payload: Payload, now: float) -> list[str]:
    rows = [(when(r["fired_at"], now), r["jid"]) for r in payload["history"]]
    lines = [f"{payload['name']}: last runs, newest first", "",
             *table(("FIRED", "JID"), rows, empty="(no runs recorded yet)"), "",
             "next runs:"]
    return lines + ([f"  {when(t, now)}" for t in payload["next_runs"]] or ["  (none)"])


COMMANDS = (AdminCommand("periodic", "list periodic entries, pause or unpause one, or show "
                                     "its last runs", run, arguments),)

"""``wurk batches [list | show BID | forget BID JID...] [--limit N] [--abandoned-after S] [--yes]``.

Duties:
1. ``list`` (the default): the newest batches still in Redis (at most
   ``--limit``), each with its state, counts and description.
2. ``show BID``: one batch in full: counts, failures with jids and errors,
   dead jids, parent and children, callbacks and when each fired, workflow
   data, time left, and any problem found reading it. Exit 1 when the batch
   has no record (never made, or expired), so a script can test it.
3. ``forget BID JID...``: uncount jobs the batch waits on that were never
   written (``--yes`` off a terminal); the batch may then finish.
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.admin.output import clip, fields, printable, table, when
from wurk.admin.registry import AdminCommand, Context, UsageError, limit_type
from wurk.batches import keys as batch_keys
from wurk.batches.api import BatchSet, BatchStatus
from wurk.core.arguments import number
from wurk.settings.bounds import YEAR

Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("list", "show", "forget"),
                        default="list", help="what to do (default: list)")
    parser.add_argument("bid", nargs="?", metavar="BID", help="the batch id (show, forget)")
    parser.add_argument("jids", nargs="*", metavar="JID",
                        help="forget: jobs counted in the batch but never written")
    parser.add_argument("--yes", action="store_true", help="forget without asking")
    parser.add_argument("--limit", type=limit_type(), default=100,
                        help="list at most this many batches (default 100)")
    parser.add_argument("--abandoned-after", type=number(float, 1, YEAR),
                        default=batch_keys.ABANDONED_AFTER,
                        metavar="SECONDS", help="an unfinished batch with no progress for "
                        f"this long is shown abandoned (default {batch_keys.ABANDONED_AFTER})")


def run(ctx: Context, args: argparse.Namespace) -> int | None:
    batches = BatchSet(config=ctx.config, abandoned_after=args.abandoned_after)
    if args.action == "list":
        found = batches.list(limit=max(1, args.limit))
        ctx.emit({"batches": [_summary(s) for s in found], "indexed": batches.size()},
                 render_list)
        return None
    if not args.bid:
        raise UsageError("usage: wurk batches show BID | forget BID JID...")
    if not batch_keys.valid_bid(args.bid):
        raise UsageError(f"BID must be 1 to {batch_keys.MAX_BID} characters")
    if args.action == "forget":
        return _forget(ctx, batches, args)
    status = batches.get(args.bid)
    ctx.emit({"batch": status.as_dict() if status.exists else None, "bid": args.bid},
             render_show)
    return None if status.exists else 1


def _forget(ctx: Context, batches: BatchSet, args: argparse.Namespace) -> int | None:
    if not args.jids or any(j.startswith(batch_keys.HOLD_PREFIX) for j in args.jids):
        raise UsageError("usage: wurk batches forget BID JID... (jobs, not holds)")
    if not args.yes:
        ctx.confirm(f"uncount {len(args.jids)} job(s) from batch {args.bid}? Only for jobs "
                    "that were never written: the batch may finish now",
                    what="forget uncounts jobs")
    forgotten = batches.forget(args.bid, list(args.jids))
    ctx.emit({"bid": args.bid, "forgotten": forgotten},
             lambda p, now: [f"batch {p['bid']}: {p['forgotten']} job(s) uncounted"])
    return None


def _summary(status: BatchStatus) -> Payload:
    keep = ("bid", "state", "description", "created_at", "updated_at", "total", "pending",
            "failures", "dead", "parent_bid", "fired")
    return {name: getattr(status, name) for name in keep}


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(b["bid"], b["state"], f"{b['total'] - b['pending']}/{b['total']}", b["failures"],
             when(b["created_at"], now), clip(printable(b["description"])) or "-")
            for b in payload["batches"]]
    return table(("BID", "STATE", "DONE", "FAILING", "CREATED", "DESCRIPTION"), rows,
                 empty="no batches")


def render_show(payload: Payload, now: float) -> list[str]:
    b = payload["batch"]
    if b is None:
        return [f"batch {payload['bid']}: no record (never made, or expired)"]
    fired = ", ".join(f"{event} {when(at, now)}" for event, at in b["fired"].items()
                      if at is not None) or "none yet"
    lines = fields([
        ("bid", b["bid"]), ("state", b["state"]), ("description", printable(b["description"])),
        ("created", when(b["created_at"], now)), ("last progress", when(b["updated_at"], now)),
        ("total", b["total"]), ("pending", b["pending"]), ("failing", b["failures"]),
        ("dead", b["dead"]), ("parent", b["parent_bid"] or "-"),
        ("children", ", ".join(b["children"]) or "-"), ("fired", fired),
        ("expires in", f"{b['ttl']}s" if b["ttl"] >= 0 else "-"),
    ])
    if b["pending_jids"]:
        lines.append("waiting on: " + ", ".join(b["pending_jids"][:20])
                     + (" ..." if len(b["pending_jids"]) > 20 else ""))
    if b["aborted"]:
        lines.append(f"aborted: {printable(b['aborted'])}")
    for failure in b["failed"]:
        lines.append(f"  failed {failure['jid']}: {failure['class']}: "
                     f"{clip(printable(failure['message']))}")
    lines.extend(f"  problem: {problem}" for problem in b["problems"])
    return lines


COMMANDS = (AdminCommand("batches", "list batches, or show one with its failures", run,
                         arguments),)

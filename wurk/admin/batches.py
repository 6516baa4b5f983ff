"""``wurk batches [list | show BID] [--limit N] [--abandoned-after SECONDS]``.

Duties:
1. ``list`` (the default): the newest batches still in Redis (at most
   ``--limit``), each with its state, counts and description.
2. ``show BID``: one batch in full: counts, failures with jids and errors,
   dead jids, parent and children, callbacks and when each fired, workflow
   data, time left, and any problem found reading it. Exit 1 when the batch
   has no record (never made, or expired), so a script can test it.
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.admin.output import clip, fields, printable, table, when
from wurk.admin.registry import AdminCommand, Context, UsageError
from wurk.api.batches import BatchSet, BatchStatus
from wurk.wire import batch as wire

Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                        help="what to do (default: list)")
    parser.add_argument("bid", nargs="?", metavar="BID", help="the batch id (for show)")
    parser.add_argument("--limit", type=int, default=100,
                        help="list at most this many batches (default 100)")
    parser.add_argument("--abandoned-after", type=float, default=wire.ABANDONED_AFTER,
                        metavar="SECONDS", help="an unfinished batch with no progress for "
                        f"this long is shown abandoned (default {wire.ABANDONED_AFTER})")


def run(ctx: Context, args: argparse.Namespace) -> int | None:
    if args.abandoned_after <= 0:
        raise UsageError("--abandoned-after must be a positive number of seconds")
    batches = BatchSet(config=ctx.config, abandoned_after=args.abandoned_after)
    if args.action == "list":
        found = batches.list(limit=max(1, args.limit))
        ctx.emit({"batches": [_summary(s) for s in found], "indexed": batches.size()},
                 render_list)
        return None
    if not args.bid:
        raise UsageError("usage: wurk batches show BID")
    if not wire.valid_bid(args.bid):
        raise UsageError(f"BID must be 1 to {wire.MAX_BID} characters")
    status = batches.get(args.bid)
    ctx.emit({"batch": status.as_dict() if status.exists else None, "bid": args.bid},
             render_show)
    return None if status.exists else 1


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
    if b["aborted"]:
        lines.append(f"aborted: {printable(b['aborted'])}")
    for failure in b["failed"]:
        lines.append(f"  failed {failure['jid']}: {failure['class']}: "
                     f"{clip(printable(failure['message']))}")
    lines.extend(f"  problem: {problem}" for problem in b["problems"])
    return lines


COMMANDS = (AdminCommand("batches", "list batches, or show one with its failures", run,
                         arguments),)

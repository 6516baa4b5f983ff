"""``wurk unique [list | show CLASS [ARGS] | release CLASS [ARGS]] [--queue Q] [--yes]``.

Duties:
1. ``list`` (the default): the unique-job locks in Redis, with holder and
   time left, at most ``--limit`` of them.
2. ``show CLASS ARGS``: the lock of one job (ARGS a JSON array, ``[]`` when
   left out, in ``--queue``): its key, holder and time left, or that none is
   held. Exit 1 when none is held, so a script can test it.
3. ``release CLASS ARGS``: drop that lock whoever holds it, after a question
   on a terminal or with ``--yes`` (the held job keeps running; a duplicate
   may then be pushed).
4. Refuse ARGS that are not a JSON array with a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from wurk.admin.output import printable, table
from wurk.admin.registry import AdminCommand, Context, UsageError, limit_type
from wurk.unique.api import UniqueLock, UniqueLocks

ACTIONS = ("list", "show", "release")
Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                        help="what to do (default: list)")
    parser.add_argument("job_class", nargs="?", metavar="CLASS", help="the job's class (wire name)")
    parser.add_argument("args", nargs="?", metavar="ARGS", default="[]",
                        help="the job's arguments as a JSON array (default [])")
    parser.add_argument("--queue", default="default", help="the job's queue (default: default)")
    parser.add_argument("--limit", type=limit_type(), default=100,
                        help="list at most this many locks (default 100)")
    parser.add_argument("--yes", action="store_true",
                        help="release without asking (needed when stdin is not a terminal)")


def run(ctx: Context, args: argparse.Namespace) -> int | None:
    locks = UniqueLocks(config=ctx.config)
    if args.action == "list":
        ctx.emit({"locks": [_lock(lock) for lock in locks.locks(max(1, args.limit))]},
                 render_list)
        return None
    if not args.job_class:
        raise UsageError(f"usage: wurk unique {args.action} CLASS [ARGS]")
    job_args = _json_array(args.args)
    key = locks.key(args.job_class, job_args, args.queue)
    if args.action == "show":
        lock = locks.read(key)
        ctx.emit({"key": key, "lock": None if lock is None else _lock(lock)}, render_show)
        return None if lock is not None else 1
    if not args.yes:
        ctx.confirm(f"release {key}?", what="release lets a duplicate be pushed")
    released = locks.release(args.job_class, job_args, args.queue)
    ctx.emit({"key": key, "released": released},
             lambda p, now: [f"{p['key']}: {'released' if p['released'] else 'was not held'}"])
    return None


def _json_array(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"ARGS must be a JSON array, got {text!r} ({exc})") from None
    if not isinstance(value, list):
        raise UsageError(f"ARGS must be a JSON array, got {text!r}")
    return value


def _lock(lock: UniqueLock) -> Payload:
    return {"key": lock.key, "holder": lock.holder, "ttl_ms": lock.ttl_ms}


def _left(ttl_ms: int) -> str:
    return "no TTL" if ttl_ms < 0 else f"{ttl_ms / 1000:.1f}s"


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(lock["key"], printable(lock["holder"]) or "-", _left(lock["ttl_ms"]))
            for lock in payload["locks"]]
    return table(("KEY", "HOLDER", "LEFT"), rows, empty="no unique-job locks")


def render_show(payload: Payload, now: float) -> list[str]:
    lock = payload["lock"]
    if lock is None:
        return [f"{payload['key']}: not held"]
    return [f"{payload['key']}: held by {printable(lock['holder']) or '-'}, "
            f"{_left(lock['ttl_ms'])} left"]


COMMANDS = (AdminCommand("unique", "list, show or release the locks of unique jobs", run,
                         arguments),)

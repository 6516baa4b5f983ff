"""``wurk profile [list | show KEY | save KEY PATH]``: job profiles (``wurk.observe.profiler``).

Duties:
1. ``list`` (the default): live profiles, newest first, after pruning the
   expired ones from the ``profiles`` index as Sidekiq 8's readers do.
2. ``show KEY``: the profile's heaviest functions by ``--sort``
   (cumulative time unless told otherwise), at most ``--limit`` of them.
3. ``save KEY PATH``: write the profile as a ``.prof`` file for
   ``python -m pstats`` or snakeviz; in a directory, a new file under the
   stored name only if it is a plain file name (else one made from KEY).
4. Name an unknown or expired key, or a profile wurk cannot read (a Ruby
   Vernier one for ``show``, or data that is not a profile wurk wrote:
   :mod:`wurk.wire.profile_data` checks it), in one line, and exit 1.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from wurk.admin.output import clip, printable, table, when
from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError, limit_type
from wurk.api.profiles import SORTS, ProfileNotFoundError, ProfileSet

ACTIONS = ("list", "show", "save")
DEFAULT_LIMIT = 25
Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                        help="what to do (default: list)")
    parser.add_argument("key", nargs="?", help="a profile key, <token>-<jid> (show, save)")
    parser.add_argument("path", nargs="?", help="the file or directory to write (save)")
    parser.add_argument("--sort", choices=SORTS, default="cumulative",
                        help="show: order functions by this (default cumulative)")
    parser.add_argument("--limit", type=limit_type(), default=DEFAULT_LIMIT,
                        help=f"show: at most this many functions (default {DEFAULT_LIMIT})")


def run(ctx: Context, args: argparse.Namespace) -> None:
    profiles = ProfileSet(config=ctx.config)
    wanted = {"list": (), "show": ("key",), "save": ("key", "path")}[args.action]
    extra = [name for name in ("key", "path") if getattr(args, name) and name not in wanted]
    missing = [name.upper() for name in wanted if not getattr(args, name)]
    if missing or extra:
        usage = " ".join(["profile", args.action, *(n.upper() for n in wanted)])
        raise UsageError(f"usage: wurk {usage}")
    try:
        {"list": do_list, "show": do_show, "save": do_save}[args.action](ctx, profiles, args)
    except (ProfileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from None


def do_list(ctx: Context, profiles: ProfileSet, args: argparse.Namespace) -> None:
    ctx.emit({"profiles": [record.to_dict() for record in profiles.entries()]}, render_list)


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(p["key"], p["type"], when(p["started_at"], now), f"{p['elapsed']:.3f}s",
             p["size"], when(p["expires_at"], now)) for p in payload["profiles"]]
    return table(("KEY", "TYPE", "STARTED", "ELAPSED", "BYTES", "EXPIRES"), rows,
                 empty="no profiles (push a job with a \"profile\" token to record one)")


def do_show(ctx: Context, profiles: ProfileSet, args: argparse.Namespace) -> None:
    record = profiles.fetch(args.key)
    functions = profiles.top(args.key, sort=args.sort, limit=args.limit)
    ctx.emit({"key": record.key, "jid": record.jid, "elapsed": record.elapsed,
              "sort": args.sort, "functions": [asdict(f) for f in functions]}, render_show)


def render_show(payload: Payload, now: float) -> list[str]:
    rows = [(f"{f['cumtime']:.6f}", f"{f['tottime']:.6f}",
             f["calls"] if f["calls"] == f["primitive_calls"]
             else f"{f['calls']}/{f['primitive_calls']}", clip(f["function"], 100))
            for f in payload["functions"]]
    head = printable(f"{payload['key']}: job {payload['jid']} ran {payload['elapsed']:.3f}s")
    return [head, "", *table(("CUMTIME", "TOTTIME", "CALLS", "FUNCTION"), rows,
                             empty="(no functions recorded)")]


def do_save(ctx: Context, profiles: ProfileSet, args: argparse.Namespace) -> None:
    path = profiles.save(args.key, args.path)
    ctx.emit({"key": args.key, "path": str(path), "bytes": path.stat().st_size},
             lambda payload, now: [f"wrote {payload['path']} ({payload['bytes']} bytes); "
                                   f"open it with: python -m pstats {payload['path']}"])


COMMANDS = (AdminCommand("profile", "list, show or save job profiles (jobs pushed with a "
                                    "profile token)", run, arguments),)

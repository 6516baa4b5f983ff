"""``wurk spool [list|push|discard] [FILE ...] [--all] [--yes] [--any-target]``.

The spool holds pushes that processes could not send before they exited
(see :mod:`wurk.push.spool`); workers push it on their own, this is for people.

Duties:
1. ``list`` (the default): every spool file in ``spool_dir``, oldest first:
   its state (waiting, claimed by a pid, bad), the Redis it belongs to, its
   age, its job count and (in the JSON) its jids; the flaw of a bad one.
2. ``push``: push now every file of this Redis that no live process holds
   (``--any-target``: of any Redis, into this one), as a worker would;
   exit 1 if a file could not be pushed or was moved aside.
3. ``discard`` the named files (or ``--all``): asks on a terminal, needs
   ``--yes`` otherwise; a file a live drainer holds is left (exit 1). Its
   jobs end first, with what their push took (:func:`discard_file`): their
   unique locks, batch counts and result waiters, as a deleted queued job's.
   A file Redis could not be told about (unreachable, refusing) is kept
   (exit 1); an unreadable one, or one for another Redis (without
   ``--any-target``), is deleted with nothing to release here.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import redis.exceptions as rx

from wurk.admin.output import table, when
from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError
from wurk.api.removal import discard_spooled
from wurk.core import pids
from wurk.core.threads import describe as error_text
from wurk.push import spool
from wurk.push.spool_drain import drain_once
from wurk.redis.runtime import Runtime

ACTIONS = ("list", "push", "discard")
Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                        help="what to do (default: list)")
    parser.add_argument("files", nargs="*", metavar="FILE", help="spool files to discard")
    parser.add_argument("--all", action="store_true", help="discard every spool file")
    parser.add_argument("--yes", action="store_true", help="discard without asking")
    parser.add_argument("--any-target", action="store_true",
                        help="push files written for another Redis into this one too "
                             "(discard: release what their jobs took in this one)")


def describe(name: spool.SpoolName, now: float) -> Payload:
    """What a file holds, read without claiming it; a flaw goes in ``error``."""
    info: Payload = {"file": name.path.name, "state": name.state, "claimed_by": name.claimer,
                     "claimer_alive": _alive(name.claimer), "target": None,
                     "written_by": None, "written_at": None, "age": None, "jobs": None,
                     "jids": [], "error": None}
    try:
        with name.path.open("rb") as fh:
            header = spool.read_header(fh)
            info.update(target=header.target, written_by=header.pid,
                        written_at=header.written_at, age=max(0.0, now - header.written_at),
                        jobs=header.jobs)
            info["jids"] = [entry.jid for entry in spool.read_entries(fh, header)]
    except spool.SpoolFormatError as exc:
        info["error"] = str(exc)
    except OSError as exc:
        info["error"] = f"cannot read: {exc.strerror}"
    return info


def _alive(pid: int | None) -> bool | None:
    return None if pid is None else pids.alive(pid)


# -- list ------------------------------------------------------------------------
def do_list(ctx: Context, directory: Path, args: argparse.Namespace) -> None:
    if args.files or args.all:
        raise UsageError("list takes no FILEs and no --all")
    files = [describe(name, ctx.now) for name in spool.spool_files(directory)]
    ctx.emit({"directory": str(directory), "target": spool.target_of(ctx.config),
              "files": files}, render_list)


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(f["file"], _state(f), "" if f["jobs"] is None else f["jobs"],
             when(f["written_at"], now), f["target"] or "", f["error"] or "")
            for f in payload["files"]]
    lines = table(("FILE", "STATE", "JOBS", "WRITTEN", "REDIS", "ERROR"), rows,
                  empty=f"the spool in {payload['directory']} is empty")
    return [f"spool: {payload['directory']}", *lines]


def _state(info: Payload) -> str:
    if info["state"] != "claimed":
        return str(info["state"])
    return f"claimed by {info['claimed_by']}{'' if info['claimer_alive'] else ' (dead)'}"


# -- push ------------------------------------------------------------------------
def do_push(ctx: Context, directory: Path, args: argparse.Namespace) -> None:
    if args.files or args.all or args.yes:
        raise UsageError("push takes no FILEs, --all or --yes: it pushes every file it can")
    try:
        report = drain_once(ctx.config, ctx.runtime.pool, any_target=args.any_target)
    except OSError as exc:
        raise CommandError(f"cannot read the spool in {directory}: {exc}") from exc
    ctx.emit({"directory": str(directory),
              "pushed": [{"file": f, "jobs": len(jids), "jids": jids} for f, jids in report.pushed],
              "bad": [{"file": Path(f).name, "error": e} for f, e in report.bad],
              "failed": [{"file": f, "error": e} for f, e in report.failed],
              "busy": report.busy, "other_target": report.other_target}, render_push)
    trouble = [f for f, _ in report.failed] + [Path(f).name for f, _ in report.bad]
    if trouble:
        raise CommandError(f"{len(trouble)} spool file(s) not pushed: {', '.join(trouble)}")


def render_push(payload: Payload, now: float) -> list[str]:
    jobs = sum(f["jobs"] for f in payload["pushed"])
    lines = [f"pushed {jobs} jobs from {len(payload['pushed'])} spool files"]
    lines += [f"moved aside {f['file']}: {f['error']}" for f in payload["bad"]]
    lines += [f"not pushed {f['file']}: {f['error']}" for f in payload["failed"]]
    lines += [f"held by a live process: {f}" for f in payload["busy"]]
    lines += [f"for another Redis (--any-target pushes it): {f}"
              for f in payload["other_target"]]
    return lines


# -- discard -----------------------------------------------------------------------
def discard_file(runtime: Runtime, held: spool.Claim, *,
                 any_target: bool = False) -> int | None:
    """Delete a claimed spool file, its jobs ended first with what their push
    took; how many gave something back (None: unreadable, or for another
    Redis, so nothing was released here). Redis trouble is raised, the file
    given back."""
    try:
        with held.reader() as fh:
            header = spool.read_header(fh)
            jobs = [(entry.nonce, entry.job) for entry in spool.read_entries(fh, header)]
    except (spool.SpoolFormatError, OSError):
        jobs = None  # nothing a push took can be read from it: its TTLs end that
    released = None
    if jobs is not None and (any_target or header.target == spool.target_of(runtime.config)):
        try:
            released = discard_spooled(runtime, jobs)
        except BaseException:
            held.release()  # kept, under its waiting name, for a later try
            raise
    held.finish()
    return released


def do_discard(ctx: Context, directory: Path, args: argparse.Namespace) -> None:
    chosen = _select(directory, args)
    infos = [describe(name, ctx.now) for name in chosen]
    jobs = sum(info["jobs"] or 0 for info in infos)
    if not args.yes:
        ctx.confirm(f"discard {jobs} jobs in {len(chosen)} spool files from {directory}?",
                    what="discard deletes jobs")
    done: list[Payload] = []
    busy: list[str] = []
    failed: list[Payload] = []
    for name, info in zip(chosen, infos, strict=True):
        held = spool.claim(name)
        if held is None:
            busy.append(name.path.name)
            continue
        try:
            released = discard_file(ctx.runtime, held, any_target=args.any_target)
        except (rx.RedisError, OSError) as exc:
            failed.append({"file": info["file"], "error": error_text(exc)})
            continue
        done.append({"file": info["file"], "jobs": info["jobs"], "jids": info["jids"],
                     "released": released})
    ctx.emit({"directory": str(directory), "discarded": done, "busy": busy, "failed": failed},
             render_discard)
    if busy or failed:
        raise CommandError("not discarded: " + ", ".join(
            [f"{f} (held by a live process)" for f in busy]
            + [f"{f['file']} ({f['error']})" for f in failed]))


def _select(directory: Path, args: argparse.Namespace) -> list[spool.SpoolName]:
    if args.all == bool(args.files):
        raise UsageError("discard needs FILEs or --all (one of them)")
    files = spool.spool_files(directory)
    if args.all:
        return files
    by_name = {name.path.name: name for name in files} | {name.base: name for name in files}
    missing = [f for f in args.files if Path(f).name not in by_name]
    if missing:
        raise CommandError(f"no spool file {', '.join(map(repr, missing))} in {directory}")
    return list({by_name[Path(f).name].path: by_name[Path(f).name] for f in args.files}.values())


def render_discard(payload: Payload, now: float) -> list[str]:
    jobs = sum(f["jobs"] or 0 for f in payload["discarded"])
    released = sum(f["released"] or 0 for f in payload["discarded"])
    lines = [f"discarded {jobs} jobs in {len(payload['discarded'])} spool files; "
             f"{released} gave back what their push took (unique locks, batch counts)"]
    lines += [f"  {f['file']}: nothing released here (unreadable, or for another Redis: "
              "--any-target releases in this one)" for f in payload["discarded"]
              if f["released"] is None]
    lines += [f"held by a live process: {f}" for f in payload["busy"]]
    return lines + [f"not discarded {f['file']}: {f['error']}" for f in payload["failed"]]


RUNNERS = {"list": do_list, "push": do_push, "discard": do_discard}


def run(ctx: Context, args: argparse.Namespace) -> None:
    ctx.now = time.time()
    RUNNERS[args.action](ctx, spool.spool_dir(ctx.config), args)


COMMANDS = (AdminCommand("spool", "list, push or discard pushes spooled at exit", run,
                         arguments),)

"""``wurk retries|dead|scheduled [list|show|retry|delete|clear] [JID ...] [--all] [--yes]``.

Duties:
1. ``list`` (the default): the entries, soonest first (the morgue newest
   death first), at most ``--limit`` of them, with the set's full size.
2. ``show JID ...``: everything a person needs to judge one failure: the
   error, the stored backtrace (if the job kept one), the arguments and the
   retry fields.
3. ``retry``: push the named entries (or ``--all``) back to their queues
   now; from ``retry`` and ``dead`` that is Sidekiq's retry (``retry_count``
   decremented), from ``scheduled`` it runs the job now.
4. ``delete`` the named entries (or ``--all``); ``clear`` (or ``clear --all``)
   empties the set. Both destroy jobs, so they ask on a terminal and need
   ``--yes`` anywhere else; each job's unique lock, batch count and result
   waiters are released with it (``wurk.api.removal``).
5. Name every unknown jid and act on none of them (exit 1); report an entry
   another operator moved meanwhile, after acting on the rest (exit 1).
6. An entry with no jid a person can type (not JSON, no jid, a lone
   surrogate) is listed, shown and named by its handle, ``raw-`` and a
   digest of its bytes; in ``dead`` its error is the reason wurk noted.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from wurk.admin.output import clip, table, when
from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError, limit_type
from wurk.api import DeadSet, RetrySet, ScheduledSet, SortedEntry, SortedSet

ACTIONS = ("list", "show", "retry", "delete", "clear")
DEFAULT_LIMIT = 100
# What the WHEN column means in each set.
WHEN_HEADER = {"schedule": "RUNS", "retry": "NEXT TRY", "dead": "DIED"}
Payload = dict[str, Any]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS, default="list",
                        help="what to do (default: list)")
    parser.add_argument("jids", nargs="*", metavar="JID",
                        help="the entries to act on, by jid (or the raw-... handle listed "
                             "for one with none)")
    parser.add_argument("--all", action="store_true",
                        help="retry, delete or clear every entry")
    parser.add_argument("--yes", action="store_true",
                        help="delete or clear without asking (needed when stdin is not a terminal)")
    parser.add_argument("--limit", type=limit_type(0), default=DEFAULT_LIMIT,
                        help=f"list at most this many entries (default {DEFAULT_LIMIT}; 0: all)")


def entry_payload(entry: SortedEntry) -> Payload:
    return {"jid": entry.jid, "handle": entry.handle, "class": entry.klass, "queue": entry.queue,
            "args": entry.display_args, "at": entry.at, "retry_count": entry.retry_count,
            "error_class": entry.error_class, "error_message": entry.error_message}


# -- list ------------------------------------------------------------------------
def do_list(ctx: Context, jobs: SortedSet, args: argparse.Namespace) -> None:
    if args.jids or args.all:
        raise UsageError("list takes no JIDs and no --all")
    entries = jobs.entries(descending=isinstance(jobs, DeadSet))
    shown = [entry_payload(e) for e in islice(entries, args.limit or None)]
    ctx.emit({"set": jobs.name, "size": jobs.size, "entries": shown}, render_list)


def render_list(payload: Payload, now: float) -> list[str]:
    rows = [(e["handle"], e["class"], e["queue"], when(e["at"], now),
             "" if e["retry_count"] is None else e["retry_count"], _error(e),
             clip(e["args"], 40)) for e in payload["entries"]]
    header = ("JID", "CLASS", "QUEUE", WHEN_HEADER.get(payload["set"], "AT"), "RETRIES",
              "ERROR", "ARGS")
    lines = table(header, rows, empty=f"the {payload['set']} set is empty")
    if len(rows) < payload["size"]:
        lines.append(f"({len(rows)} of {payload['size']} shown; --limit 0 shows all)")
    return lines


def _error(entry: Payload) -> str:
    if entry["error_class"] is None:
        return ""
    return clip(f"{entry['error_class']}: {entry['error_message'] or ''}", 50)


# -- show ------------------------------------------------------------------------
def show_payload(entry: SortedEntry) -> Payload:
    return {**entry_payload(entry), "args": entry.args, "display_args": entry.display_args,
            "error_backtrace": entry.error_backtrace, "failed_at": entry.failed_at,
            "retried_at": entry.retried_at, "retry": entry["retry"],
            "enqueued_at": entry.enqueued_at, "created_at": entry.created_at}


def do_show(ctx: Context, jobs: SortedSet, args: argparse.Namespace) -> None:
    if args.all or not args.jids:
        raise UsageError("show needs one or more JIDs (and no --all)")
    shown = [show_payload(entry) for entry in select(jobs, args)]
    ctx.emit({"set": jobs.name, "entries": shown}, render_show)


def render_show(payload: Payload, now: float) -> list[str]:
    lines: list[str] = []
    for e in payload["entries"]:
        lines += [f"{e['handle']}  {e['class']}  queue {e['queue']}",
                  f"  {WHEN_HEADER.get(payload['set'], 'at').lower()}: {when(e['at'], now)}",
                  f"  error: {_error_text(e)}",
                  f"  args: {json.dumps(e['args'], default=str)}",
                  f"  retry: {e['retry']!r}  retry_count: {e['retry_count']!r}  "
                  f"failed: {when(e['failed_at'], now)}  retried: {when(e['retried_at'], now)}"]
        trace = e["error_backtrace"]
        lines += (["  backtrace:", *(f"    {line}" for line in trace)] if trace
                  else ["  backtrace: none stored (push the job with backtrace=True to keep one)"])
    return lines


def _error_text(entry: Payload) -> str:
    if entry["error_class"] is None:
        return "none"
    return f"{entry['error_class']}: {entry['error_message'] or ''}"


# -- retry / delete / clear --------------------------------------------------------
def do_retry(ctx: Context, jobs: SortedSet, args: argparse.Namespace) -> None:
    def move(entry: SortedEntry) -> bool:
        return entry.add_to_queue() if isinstance(jobs, ScheduledSet) else entry.retry()
    _act(ctx, jobs, args, move)


def do_delete(ctx: Context, jobs: SortedSet, args: argparse.Namespace) -> None:
    chosen = list(select(jobs, args))
    if not args.yes:
        ctx.confirm(f"delete {_count(len(chosen))} from the {jobs.name} set?",
                    what="delete removes jobs")
    _act(ctx, jobs, args, SortedEntry.delete, chosen)


def _act(ctx: Context, jobs: SortedSet, args: argparse.Namespace,
         act: Callable[[SortedEntry], bool],
         chosen: Iterable[SortedEntry] | None = None) -> None:
    done: list[str | None] = []
    lost: list[str | None] = []
    for entry in select(jobs, args) if chosen is None else chosen:
        (done if act(entry) else lost).append(entry.handle)
    ctx.emit({"set": jobs.name, "action": args.action, "count": len(done), "jids": done},
             render_action)
    if lost:
        raise CommandError(f"{_quoted(lost)} left the {jobs.name!r} set before this "
                           f"{args.action} reached {'it' if len(lost) == 1 else 'them'}")


def select(jobs: SortedSet, args: argparse.Namespace) -> Iterable[SortedEntry]:
    """The entries named by jid (all must exist) or, with ``--all``, every entry."""
    if args.all and args.jids:
        raise UsageError(f"give {args.action} JIDs or --all, not both")
    if not args.all and not args.jids:
        raise UsageError(f"{args.action} needs JIDs or --all")
    if args.all:
        return jobs
    found = {jid: jobs.find_job(jid) for jid in dict.fromkeys(args.jids)}
    missing = [jid for jid, entry in found.items() if entry is None]
    if missing:
        noun = "job with jid" if len(missing) == 1 else "jobs with jids"
        raise CommandError(f"no {noun} {_quoted(missing)} in the {jobs.name!r} set")
    return [entry for entry in found.values() if entry is not None]


def do_clear(ctx: Context, jobs: SortedSet, args: argparse.Namespace) -> None:
    if args.jids:
        raise UsageError("clear takes no JIDs: it empties the whole set "
                         "(delete JID ... removes single entries)")
    size = jobs.size
    if not args.yes:
        ctx.confirm(f"clear the {jobs.name} set ({_count(size)})?",
                    what="clear removes every job in the set")
    cleared = jobs.clear()
    ctx.emit({"set": jobs.name, "action": "clear", "count": cleared, "jids": None},
             render_action)


def render_action(payload: Payload, now: float) -> list[str]:
    verb = {"retry": "retried", "delete": "deleted", "clear": "cleared"}[payload["action"]]
    if payload["set"] == "schedule" and payload["action"] == "retry":
        verb = "queued now"
    noun = "job" if payload["count"] == 1 else "jobs"
    line = f"{verb} {payload['count']} {noun} from the {payload['set']} set"
    return [f"{line}: {', '.join(map(str, payload['jids']))}" if payload["jids"] else line]


def _count(jobs: int) -> str:
    return f"{jobs} job" + ("" if jobs == 1 else "s")


def _quoted(jids: Iterable[str | None]) -> str:
    return ", ".join(repr(jid) for jid in jids)


ACTION_RUNNERS = {"list": do_list, "show": do_show, "retry": do_retry, "delete": do_delete,
                  "clear": do_clear}


def sorted_set_command(name: str, kind: type[SortedSet], what: str) -> AdminCommand:
    def run(ctx: Context, args: argparse.Namespace) -> None:
        ACTION_RUNNERS[args.action](ctx, kind(config=ctx.config), args)
    return AdminCommand(name, f"list, show, retry, delete or clear {what}", run, arguments)


COMMANDS = (
    sorted_set_command("retries", RetrySet, "failed jobs waiting to be retried"),
    sorted_set_command("dead", DeadSet, "jobs in the morgue"),
    sorted_set_command("scheduled", ScheduledSet, "jobs scheduled for later"),
)

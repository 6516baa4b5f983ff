"""Jobs removed by a person, one or a whole queue or set, with what they hold.

A job deleted or killed from the API, ``wurk`` or the dashboard never runs
again, so it ends there, and everything it holds goes with it in the same
Lua script as its removal (:mod:`wurk.api.removal_lua`): its unique lock,
its count in its batch (and so its workflow's step), its result waiters.

Duties:
1. :class:`Ending`: how the job ended, as its batch and result waiters hear
   it: killed (``JobKilledError``: it failed for good, moved to ``dead``)
   or deleted (``JobDeletedError``: gone, counted as an expired job is, a
   failure that will not run again) or cancelled (``JobCancelled``: the
   same as deleted, under its own name), and from where.
2. :func:`plan`: the script's values for one member, read leniently from
   untrusted bytes: its lock (a unique job's), its batch (a usable bid), its
   result (a job that asked for one). A member of ``dead`` gives back only
   its lock: its batch and its waiters heard of its death when it died.
3. :func:`remove`: run the script over members, CHUNK at a time, and say
   which ones this call removed. :func:`discard_spooled`: the same for the
   jobs of a spool file a person discards, which never reached a queue but
   took their locks and batch counts at push.
4. :func:`clear`: empty a queue or set without holding Redis or the whole
   set in memory: rename it to a private key (what is pushed meanwhile is
   not cleared), then remove CHUNK members per script until it is empty.
   A clear cut short (a killed process, Redis gone) leaves its private key
   in ``wurk:clearing``; the next clear of anything finishes it first.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wurk.api.errors import JobDeletedError, JobKilledError
from wurk.api.removal_lua import REMOVE, TAKE
from wurk.batches import keys as batch
from wurk.batches.step import failure_info
from wurk.core.job_errors import JobCancelled
from wurk.redis.runtime import Runtime
from wurk.results import records as results
from wurk.unique import keys as unique
from wurk.wire import keys
from wurk.wire.payload import parse_item, score, writable

# Members per script: a few milliseconds of Redis time, a bounded reply.
CHUNK = 200
# The leftovers of clears cut short that one clear finishes first.
LEFTOVERS = 10
LIST, ZSET = "list", "zset"
# The jobs of a spool file being discarded: a source with no key in Redis.
SPOOL = "spool"
PLACES = {keys.RETRY: "the retry set", keys.SCHEDULE: "the schedule",
          keys.DEAD: "the dead set", SPOOL: "the spool"}


def place_of(source: str) -> str:
    """How a message names the queue or set a job was removed from."""
    if source.startswith("queue:"):
        return f"queue {source[len('queue:'):]!r}"
    return PLACES.get(source, source)


@dataclass(frozen=True)
class Ending:
    """Why a job ends here: ``killed`` (moved to dead), deleted or ``cancelled``
    (deleted, its batch and waiters told ``JobCancelled``), from ``source``."""

    source: str
    killed: bool = False
    cancelled: bool = False

    @property
    def error_class(self) -> str:
        if self.cancelled:
            return JobCancelled.__name__
        return (JobKilledError if self.killed else JobDeletedError).__name__

    def message(self, item: dict[str, Any]) -> str:
        verb = "killed" if self.killed else "cancelled" if self.cancelled else "deleted"
        said = f"{verb} by a person from {place_of(self.source)}"
        error, text = item.get("error_class"), item.get("error_message")
        if isinstance(error, str):
            said += f"; its last error was {error[:200]}: {text if isinstance(text, str) else ''}"
        return _scrub(said[:1000])


def _text(value: Any) -> str:
    """A field Redis can take as it is, or "" for none."""
    return value if isinstance(value, str) and value and writable(value) else ""


def _scrub(text: str) -> str:
    """``text`` with any lone surrogate written as its escape, so Redis takes it."""
    return text if writable(text) else text.encode("utf-8", "backslashreplace").decode()


def _told(item: dict[str, Any], jid: str) -> dict[str, Any]:
    """The fields a batch's failure and a result record name, made writable."""
    count = item.get("retry_count")
    return {"jid": jid, "class": _scrub(str(item.get("class"))[:200]),
            "retry_count": count if isinstance(count, int) and not isinstance(count, bool)
            else None}


def plan(value: bytes | str, ending: Ending) -> list[Any]:
    """The script's GROUP values for one member; just the member when it holds nothing."""
    item = parse_item(value)
    jid = _text(item.get("jid")) if item is not None else ""
    if item is None or not jid:
        return [value, "", "", "", "", "", "", "", ""]
    lock = _text(unique.lock_of(item)) if unique.is_unique(item) else ""
    if ending.source == keys.DEAD:  # its batch and waiters were told when it died
        return [value, lock, jid, "", "", "", "", "", ""]
    message, now, told = ending.message(item), time.time(), _told(item, jid)
    bid = _text(batch.bid_of(item))
    info = _written(lambda: failure_info(told, ending.error_class, message)) if bid else ""
    record = (_written(lambda: results.error_record(told, ending.error_class, message, True,
                                                    now))
              if results.TTL in item else "")
    return [value, lock, jid, bid if info else "", info,
            results.key(jid), results.ready_key(jid), record,
            results.ttl_of(item) if record else ""]


def _written(build: Any) -> str:
    """A record built from untrusted fields, or "" when one cannot be written."""
    try:
        made = build()
    except (TypeError, ValueError, RecursionError):
        return ""
    return made if isinstance(made, str) and writable(made) else ""


def remove(runtime: Runtime, source: str, kind: str, values: Sequence[bytes | str],
           ending: Ending, *, idempotent: bool) -> list[bool]:
    """Remove each of ``values`` from ``source`` (a list or a sorted set) with what
    it holds; True for each this call removed (another caller may have first)."""
    removed: list[bool] = []
    for start in range(0, len(values), CHUNK):
        groups = [plan(value, ending) for value in values[start:start + CHUNK]]
        removed += _chunk(runtime, source, kind, groups, ending, idempotent=idempotent)
    return removed


def discard_spooled(runtime: Runtime, jobs: Sequence[tuple[str, str]]) -> int:
    """End the jobs of a spool file being discarded, given as (push nonce, raw
    payload), with what their push took (a lock, a batch count, result
    waiters), as a delete of a queued job does; how many gave something back.
    A job whose push landed after all (its push marker holds a nonce) is left:
    it waits in its queue, holding what it took. A job that holds nothing
    costs no round trip."""
    ending = Ending(SPOOL)
    groups = [[nonce, *plan(raw, ending)[1:]] for nonce, raw in jobs]
    # Its lock, its batch (with the failure to record) or its result record.
    holding = [group for group in groups if group[1] or group[3] or group[7]]
    released = 0
    for start in range(0, len(holding), CHUNK):
        # Replay-safe: each job ended is marked in the same script; a replay finds the marks.
        released += sum(_chunk(runtime, keys.PUSHED_PREFIX, SPOOL, holding[start:start + CHUNK],
                               ending, idempotent=True))
    return released


def _chunk(runtime: Runtime, source: str, kind: str, groups: Sequence[list[Any]],
           ending: Ending, *, idempotent: bool) -> list[bool]:
    now = time.time()
    dead_source = ending.source == keys.DEAD  # a clear's private key stands for it
    args: list[Any] = [kind, source, "kill" if ending.killed else "delete", keys.DEAD,
                       score(now), score(now - runtime.config.dead_timeout),
                       runtime.config.dead_max_jobs,
                       keys.DEAD_NOTES if dead_source else "",
                       keys.DEAD_NOTES_AT if dead_source else "", keys.SUSPECTS,
                       keys.PILL_PREFIX, keys.PUSHED_TTL]
    for group in groups:
        args += group
    replies = runtime.pool.run(lambda c: REMOVE.run(c, [], args), idempotent=idempotent)
    return [reply == 1 for reply in replies]


def clear(runtime: Runtime, source: str, *, queue: str | None = None) -> int:
    """Empty ``source`` (a queue, with its ``queue`` name, or a sorted set) and
    release what its jobs hold; how many jobs it removed."""
    for private, origin in _leftovers(runtime):
        _drain(runtime, private, origin)
    private = keys.clearing(secrets.token_hex(12))
    # Replay-safe: a replay finds the private key noted and takes nothing more.
    taken = runtime.pool.run(lambda c: TAKE.run(
        c, [source, private, keys.CLEARING, keys.QUEUES],
        [queue or "", keys.CLEARING_TTL]), idempotent=True)
    return _drain(runtime, private, source) if int(taken) > 0 else 0


def _leftovers(runtime: Runtime) -> list[tuple[str, str]]:
    """A few private keys of clears cut short, with the key each was taken from."""
    # One page: each clear finishes a few, the next ones the rest.
    _, found = runtime.pool.call("HSCAN", keys.CLEARING, 0, "COUNT", LEFTOVERS,
                                     idempotent=True)
    pairs = zip(found[::2], found[1::2], strict=True)
    return [(_str(private), _str(origin)) for private, origin in pairs][:LEFTOVERS]


def _str(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _drain(runtime: Runtime, private: str, origin: str) -> int:
    """Remove every member of the private key, CHUNK per script; then forget it."""
    pool = runtime.pool
    kind = ZSET if pool.call("TYPE", private, idempotent=True) in ("zset", b"zset") else LIST
    ending = Ending(origin)
    removed = 0
    while True:
        values = _head(runtime, private, kind)
        if not values:
            break
        # Replay-safe: only this clear (or a later one finishing it) takes from the
        # private key; a replay finds the members gone. A byte-identical copy it
        # may remove instead is the same job, holding the same things.
        groups = [plan(value, ending) for value in values]
        removed += sum(_chunk(runtime, private, kind, groups, ending, idempotent=True))
    # Replay-safe: dropping a field that is gone changes nothing.
    pool.call("HDEL", keys.CLEARING, private, idempotent=True)
    return removed


def _head(runtime: Runtime, private: str, kind: str) -> list[Any]:
    command = "LRANGE" if kind == LIST else "ZRANGE"
    values: list[Any] = runtime.pool.call(command, private, 0, CHUNK - 1, idempotent=True)
    return values


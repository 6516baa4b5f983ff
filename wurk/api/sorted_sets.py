"""The scheduled, retry and dead sets: browse, search, clear, and bulk moves.

Duties:
1. Browse a ZSET by score in pages of 50, resuming each page from the last
   (score, member) seen rather than from a rank, so entries moved or
   deleted during the walk (``retry_all``, ``kill_all``) skip nothing.
2. Find an entry by jid (or by the ``raw-<digest>`` handle of one with
   none), or every entry containing a substring (ZSCAN MATCH
   ``*substring*``), as :class:`SortedEntry` objects that act on
   themselves (see ``wurk.api.entries``).
3. Clear a set, a chunk at a time, releasing what its jobs hold
   (``wurk.api.removal``; a dead entry's note goes with it); retry or kill
   every entry; and, on the morgue, kill a
   payload with Sidekiq's size and age caps (``dead_max_jobs``,
   ``dead_timeout``). The morgue's entries come with the notes wurk wrote
   for those it keeps as raw bytes, read a page at a time (:meth:`annotate`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from wurk.api import removal
from wurk.api.entries import SortedEntry, run_death_handlers
from wurk.api.errors import JobNotFoundError
from wurk.push.client import Client
from wurk.redis.runtime import runtime_for
from wurk.runtime.retry import kill as kill_into_dead
from wurk.settings.config import Config
from wurk.wire import dead_notes, keys
from wurk.wire.payload import dumps, parse_item
from wurk.wire.replies import contains_pattern, resolve, score_pairs, zscan_all

PAGE_SIZE = 50
Row = tuple[float, bytes]


class _Walk:
    """A score-ordered cursor over a ZSET that survives changes between pages.

    Each page asks for everything from the last row's score onward, plus as
    many extra rows as there were at that score already (``ties``), then drops
    what was already yielded. A deleted row cannot shift the next page.
    """

    def __init__(self, descending: bool) -> None:
        self.descending = descending
        self.last: Row | None = None   # tail of the previous reply: where to resume
        self.high: Row | None = None   # furthest row yielded: never yield it again
        self.ties = 0

    def command(self, name: str) -> tuple[Any, ...]:
        start = repr(self.last[0]) if self.last else ("+inf" if self.descending else "-inf")
        stop = "-inf" if self.descending else "+inf"
        rev = ("REV",) if self.descending else ()
        return ("ZRANGE", name, start, stop, "BYSCORE", *rev, "LIMIT", 0,
                PAGE_SIZE + self.ties, "WITHSCORES")

    def advance(self, rows: list[Row]) -> tuple[list[Row], bool]:
        """The rows not yet yielded, and whether this was the last page."""
        done = len(rows) < PAGE_SIZE + self.ties
        fresh = [row for row in rows if self._beyond(row)]
        if rows:
            self.last = rows[-1]
            self.ties = sum(1 for row in rows if row[0] == self.last[0])
        if fresh:
            self.high = fresh[-1]
        return fresh, done

    def _beyond(self, row: Row) -> bool:
        if self.high is None:
            return True
        return row < self.high if self.descending else row > self.high


class SortedSet:
    """A ZSET of job payloads scored by a time (run-at, retry-at, death)."""

    name = ""

    def __init__(self, name: str | None = None, *, config: Config | None = None) -> None:
        self.name = name or self.name
        if not self.name:
            raise ValueError("a SortedSet needs a key name")
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)
        self._client: Client | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @property
    def client(self) -> Client:
        """The client entries push through: one per set, so a bulk move keeps order."""
        if self._client is None:
            # Pushing the spool is for workers and `wurk spool push`, not an admin action.
            self._client = Client(self.config, drain_spool=False)
        return self._client

    @property
    def size(self) -> int:
        return int(self.runtime.pool.call("ZCARD", self.name, idempotent=True))

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[SortedEntry]:
        """Soonest (lowest score) first."""
        return self.entries()

    def entries(self, *, descending: bool = False) -> Iterator[SortedEntry]:
        walk = _Walk(descending)
        while True:
            reply = self.runtime.pool.call(*walk.command(self.name), idempotent=True)
            rows = [(at, member) for member, at in score_pairs(reply)]
            fresh, done = walk.advance(rows)
            yield from self.annotate([SortedEntry(self, at, member) for at, member in fresh])
            if done:
                return

    def annotate(self, entries: list[SortedEntry]) -> list[SortedEntry]:
        """``entries``, each with its dead note read (one HMGET for them all)."""
        if self.name != keys.DEAD or not entries:
            return entries
        notes = self.runtime.pool.call(
            "HMGET", keys.DEAD_NOTES, *(dead_notes.digest(e.value) for e in entries),
            idempotent=True)
        for entry, note in zip(entries, notes, strict=True):
            entry._note = dead_notes.parse_note(note)
        return entries

    def find_job(self, jid: str, *, must_exist: bool = False) -> SortedEntry | None:
        """The entry whose payload has ``jid`` (ZSCAN for the jid, then an exact
        check), or whose :attr:`~SortedEntry.handle` is ``jid``."""
        found = self._by_handle(jid) if dead_notes.is_handle(jid) else None
        for entry in [] if found else self.scan(jid):
            if entry.jid == jid:
                found = entry
                break
        if found is None and must_exist:
            raise JobNotFoundError(jid, f"the {self.name!r} set")
        return found

    def _by_handle(self, handle: str) -> SortedEntry | None:
        """A whole-set ZSCAN: handles name entries with no jid, rare and few."""
        rows = self.runtime.pool.run(lambda c: zscan_all(c, self.name, "*"),
                                         idempotent=True)
        for member, at in rows:
            if dead_notes.handle(member) == handle:
                return self.annotate([SortedEntry(self, at, member)])[0]
        return None

    def scan(self, substring: str) -> list[SortedEntry]:
        """Entries whose raw JSON contains ``substring``, by score."""
        pattern = contains_pattern(substring)
        rows = self.runtime.pool.run(lambda c: zscan_all(c, self.name, pattern),
                                    idempotent=True)
        return self.annotate([SortedEntry(self, at, member)
                              for member, at in sorted(rows, key=lambda row: (row[1], row[0]))])

    def clear(self) -> int:
        """Remove every entry, with what each job holds (its unique lock, its batch
        count, its result waiters: ``wurk.api.removal``), a chunk at a time;
        how many this call removed. Entries added meanwhile stay."""
        return removal.clear(self.runtime, self.name)

    def _kill_all(self) -> int:
        """Move every entry to the morgue, a chunk per script; how many this caller moved."""
        moved = 0
        for chunk in _chunks(self.entries(), removal.CHUNK):
            flags = removal.remove(self.runtime, self.name, removal.ZSET,
                                   [entry.value for entry in chunk],
                                   removal.Ending(self.name, killed=True), idempotent=True)
            for entry, flag in zip(chunk, flags, strict=True):
                if flag:
                    run_death_handlers(self.config, entry.item)
            moved += sum(flags)
        return moved


def _chunks(entries: Iterator[SortedEntry], size: int) -> Iterator[list[SortedEntry]]:
    chunk: list[SortedEntry] = []
    for entry in entries:
        chunk.append(entry)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class ScheduledSet(SortedSet):
    """``schedule``: jobs waiting for their run-at time (spec §3)."""

    name = keys.SCHEDULE

    def add_all_to_queue(self) -> int:
        """Push every scheduled job now; returns how many this caller pushed."""
        return sum(entry.add_to_queue() for entry in self)

    def kill_all(self) -> int:
        """Move every scheduled job to the morgue; returns how many this caller moved."""
        return self._kill_all()


class _Retryable(SortedSet):
    def retry_all(self) -> int:
        """Push every entry back to its queue; returns how many this caller pushed."""
        return sum(entry.retry() for entry in self)


class RetrySet(_Retryable):
    """``retry``: failed jobs waiting for their next attempt (spec §4)."""

    name = keys.RETRY

    def kill_all(self) -> int:
        """Move every entry to the morgue; returns how many this caller moved."""
        return self._kill_all()


class DeadSet(_Retryable):
    """``dead``: the morgue, capped by size and age (spec §7)."""

    name = keys.DEAD

    @property
    def dead_max_jobs(self) -> int:
        return self.config.dead_max_jobs

    @property
    def dead_timeout(self) -> float:
        return self.config.dead_timeout

    def kill(self, job: bytes | str | Mapping[str, Any], *,
             notify_failure: bool = True) -> None:
        """Add a payload (raw JSON, kept byte for byte, or an item) and trim the set.

        As Sidekiq's DeadSet#kill: death handlers run unless ``notify_failure``
        is False.
        """
        raw = job if isinstance(job, bytes | str) else dumps(dict(job))
        kill_into_dead(self.runtime, raw, time.time())
        if notify_failure:
            item = dict(job) if isinstance(job, Mapping) else parse_item(raw)
            run_death_handlers(self.config, item or {})

"""The scheduled, retry and dead sets: browse, search, clear, and bulk moves.

Duties:
1. Browse a ZSET by score in pages of 50, resuming each page from the last
   (score, member) seen rather than from a rank, so entries moved or
   deleted during the walk (``retry_all``, ``kill_all``) skip nothing.
2. Find an entry by jid, or every entry containing a substring (ZSCAN
   MATCH ``*substring*``), as :class:`SortedEntry` objects that act on
   themselves (see ``wurk.api.entries``).
3. Clear a set; retry or kill every entry; and, on the morgue, kill a
   payload with Sidekiq's size and age caps (``dead_max_jobs``,
   ``dead_timeout``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from wurk.api.common import contains_pattern, resolve, score_pairs, zscan_all
from wurk.api.entries import SortedEntry, run_death_handlers
from wurk.api.errors import JobNotFoundError
from wurk.push.client import Client
from wurk.redis.pools import pool_for
from wurk.runtime.retry import kill as kill_into_dead
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import dumps, parse_item

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
        return int(pool_for(self.config).call("ZCARD", self.name, idempotent=True))

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[SortedEntry]:
        """Soonest (lowest score) first."""
        return self.entries()

    def entries(self, *, descending: bool = False) -> Iterator[SortedEntry]:
        walk = _Walk(descending)
        while True:
            reply = pool_for(self.config).call(*walk.command(self.name), idempotent=True)
            rows = [(at, member) for member, at in score_pairs(reply)]
            fresh, done = walk.advance(rows)
            for at, member in fresh:
                yield SortedEntry(self, at, member)
            if done:
                return

    def find_job(self, jid: str, *, must_exist: bool = False) -> SortedEntry | None:
        """The entry whose payload has ``jid`` (ZSCAN for the jid, then an exact check)."""
        for entry in self.scan(jid):
            if entry.jid == jid:
                return entry
        if must_exist:
            raise JobNotFoundError(jid, f"the {self.name!r} set")
        return None

    def scan(self, substring: str) -> list[SortedEntry]:
        """Entries whose raw JSON contains ``substring``, by score."""
        pattern = contains_pattern(substring)
        rows = pool_for(self.config).run(lambda c: zscan_all(c, self.name, pattern),
                                    idempotent=True)
        return [SortedEntry(self, at, member)
                for member, at in sorted(rows, key=lambda row: (row[1], row[0]))]

    def clear(self) -> None:
        # Not replay-safe: a replay after a lost reply would UNLINK entries
        # added in between (a fresh failure, a new scheduled job).
        pool_for(self.config).call("UNLINK", self.name)


class ScheduledSet(SortedSet):
    """``schedule``: jobs waiting for their run-at time (spec §3)."""

    name = keys.SCHEDULE

    def add_all_to_queue(self) -> int:
        """Push every scheduled job now; returns how many this caller pushed."""
        return sum(entry.add_to_queue() for entry in self)


class _Retryable(SortedSet):
    def retry_all(self) -> int:
        """Push every entry back to its queue; returns how many this caller pushed."""
        return sum(entry.retry() for entry in self)


class RetrySet(_Retryable):
    """``retry``: failed jobs waiting for their next attempt (spec §4)."""

    name = keys.RETRY

    def kill_all(self) -> int:
        """Move every entry to the morgue; returns how many this caller moved."""
        return sum(entry.kill() for entry in self)


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
        kill_into_dead(self.config, raw, time.time())
        if notify_failure:
            item = dict(job) if isinstance(job, Mapping) else parse_item(raw)
            run_death_handlers(self.config, item or {})

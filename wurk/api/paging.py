"""Pages and searches over big queues and sets, for the dashboard and scripts.

A queue may hold a million jobs and the morgue ten thousand: nothing here
reads a key whole.

Duties:
1. :func:`queue_page`: one page of a queue, newest first, by LRANGE index,
   with the queue's length, in one pipelined round trip (a page past the
   end is empty, so a script paging until an empty page ends).
2. :func:`set_page`: one page of the scheduled, retry or dead set by ZRANGE
   index, either order, with ZCARD, in one round trip.
3. :func:`search_set`: the entries whose raw JSON contains a substring
   (class, jid, an argument), by ZSCAN MATCH, stopping once ``limit``
   matches are found, sorted by score.
4. :func:`find_queued`: a queued job named by the index a page showed and
   its jid, found again near that index (the list moves while a person
   reads the page), so a form never has to carry the whole payload.
5. :func:`find_entry` and :func:`entry_key`: name one sorted-set entry by its
   score and jid (Sidekiq Web's ``score-jid``) and find it again with a
   ZRANGE over that one score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from wurk.api.entries import SortedEntry
from wurk.api.queue import Queue
from wurk.api.records import JobRecord
from wurk.api.sorted_sets import SortedSet
from wurk.wire.replies import contains_pattern, score_pairs

T = TypeVar("T")
MAX_PER_PAGE = 500
SEARCH_LIMIT = 1000
SEARCH_SCAN_COUNT = 1000


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing: ``items`` and where they sit in the whole."""

    items: list[T]
    total: int
    number: int  # 1-based
    per_page: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def first_index(self) -> int:
        """The 0-based index of the first item in the whole listing."""
        return (self.number - 1) * self.per_page


def _check(number: int, per_page: int) -> None:
    if number < 1:
        raise ValueError(f"page numbers start at 1, got {number}")
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise ValueError(f"per_page must be between 1 and {MAX_PER_PAGE}, got {per_page}")


def queue_page(queue: Queue, number: int = 1, per_page: int = 25) -> Page[JobRecord]:
    """Jobs ``(number-1)*per_page`` onward, newest first (LRANGE, O(offset + per_page))."""
    _check(number, per_page)
    start = (number - 1) * per_page
    values, total = queue.runtime.pool.pipeline(
        [("LRANGE", queue.key, start, start + per_page - 1), ("LLEN", queue.key)],
        idempotent=True)
    items = [JobRecord(value, queue.name, config=queue.config) for value in values]
    return Page(items, int(total), number, per_page)


def set_page(sorted_set: SortedSet, number: int = 1, per_page: int = 25, *,
             descending: bool = False) -> Page[SortedEntry]:
    """Entries by score (lowest first, or highest with ``descending``), one page."""
    _check(number, per_page)
    start = (number - 1) * per_page
    rev = ("REV",) if descending else ()
    reply, total = sorted_set.runtime.pool.pipeline(
        [("ZRANGE", sorted_set.name, start, start + per_page - 1, *rev, "WITHSCORES"),
         ("ZCARD", sorted_set.name)], idempotent=True)
    items = [SortedEntry(sorted_set, at, member) for member, at in score_pairs(reply)]
    return Page(sorted_set.annotate(items), int(total), number, per_page)


def search_set(sorted_set: SortedSet, substring: str, *, limit: int = SEARCH_LIMIT,
               descending: bool = False) -> tuple[list[SortedEntry], bool]:
    """Entries whose JSON contains ``substring`` (``*`` and ``?`` are wildcards).

    Returns at most ``limit`` of them, sorted by score, and whether the search
    stopped at ``limit`` before scanning the whole set (the list is then a
    sample, not all).
    """
    if not substring:
        raise ValueError("search for what? the substring is empty")
    pattern = contains_pattern(substring)
    found, truncated = sorted_set.runtime.pool.run(
        lambda conn: _scan(conn, sorted_set.name, pattern, limit), idempotent=True)
    rows = sorted(found.items(), key=lambda row: (row[1], row[0]), reverse=descending)
    # A scan step may overshoot the limit: the promise is "the first <limit>".
    return sorted_set.annotate([SortedEntry(sorted_set, at, member)
                                for member, at in rows[:limit]]), truncated


def _scan(conn: Any, name: str, pattern: str, limit: int) -> tuple[dict[bytes, float], bool]:
    cursor: Any = b"0"
    found: dict[bytes, float] = {}
    while True:
        cursor, batch = conn.call("ZSCAN", name, cursor, "MATCH", pattern,
                                  "COUNT", SEARCH_SCAN_COUNT)
        found.update(score_pairs(batch))
        if int(cursor) == 0:
            return found, False
        if len(found) >= limit:
            return found, True


def find_queued(queue: Queue, index: int, jid: str, *, near: int = 100) -> JobRecord | None:
    """The job with ``jid`` at ``index`` or within ``near`` of it, closest first."""
    if index < 0:
        return None
    start = max(0, index - near)
    values = queue.runtime.pool.call("LRANGE", queue.key, start, index + near,
                                         idempotent=True)
    records = [(abs(start + n - index), JobRecord(value, queue.name, config=queue.config))
               for n, value in enumerate(values)]
    matches = [(distance, record) for distance, record in records
               if (record.jid or "") == jid and (jid or distance == 0)]
    return min(matches, key=lambda pair: pair[0])[1] if matches else None


def entry_key(entry: SortedEntry) -> str:
    """``<score>-<jid>``: how a page names one entry (as Sidekiq Web's URLs);
    ``<score>-raw-<digest>`` for one without a jid a URL can carry."""
    return f"{entry.score!r}-{entry.handle}"


def parse_entry_key(key: str) -> tuple[float, str]:
    """The (score, jid) of an :func:`entry_key`; ValueError when it is not one."""
    # The score may be negative or have an exponent ("1e-05"): the separator
    # is the first dash past the sign that no "e" comes right before.
    cut = next((i for i in range(1, len(key)) if key[i] == "-" and key[i - 1] not in "eE"), -1)
    if cut < 0:
        raise ValueError(f"not an entry key: {key[:80]!r}")
    at, jid = float(key[:cut]), key[cut + 1:]
    # Infinite scores are kept (another client may write one, and a person
    # must reach it to delete it); NaN is never a score.
    if math.isnan(at):
        raise ValueError(f"not an entry key: {key[:80]!r}")
    return at, jid


def find_entry(sorted_set: SortedSet, key: str) -> SortedEntry | None:
    """The entry an :func:`entry_key` names, or None if it is gone (or the key is bad)."""
    try:
        at, jid = parse_entry_key(key)
    except ValueError:
        return None
    reply = sorted_set.runtime.pool.call(
        "ZRANGE", sorted_set.name, repr(at), repr(at), "BYSCORE", "WITHSCORES",
        idempotent=True)
    for member, score in score_pairs(reply):
        entry = SortedEntry(sorted_set, score, member)
        # An empty jid: a key from before handles, naming the entry with none.
        if entry.handle == jid or (not jid and entry.jid is None):
            return entry
    return None

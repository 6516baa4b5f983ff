"""Queues as an operator sees them: list, size, latency, pause, browse, clear.

Duties:
1. Name the known queues (the ``queues`` SET), sorted, and look one up by
   name, raising :class:`UnknownQueueError` when asked to insist it exists.
2. Measure size (LLEN) and latency: now minus the ``enqueued_at`` of the
   oldest job (index -1), read as float seconds or Sidekiq 8's integer ms.
3. Pause and unpause through the ``paused`` SET that wurk's fetchers (and
   Sidekiq Pro's) skip.
4. Browse newest first in pages of 50 as :class:`JobRecord`, find a job by
   jid, and clear the queue (SREM its name; each job removed with what it
   holds, a chunk at a time: ``wurk.api.removal``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wurk.api import removal
from wurk.api.errors import JobNotFoundError, UnknownQueueError
from wurk.api.records import JobRecord
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import latency_of
from wurk.wire.replies import resolve, sscan_all

PAGE_SIZE = 50


class Queue:
    def __init__(self, name: str = "default", *, config: Config | None = None) -> None:
        self.name = name
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)
        self.key = keys.queue(name)

    def __repr__(self) -> str:
        return f"<Queue {self.name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Queue) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @classmethod
    def all(cls, *, config: Config | None = None) -> list[Queue]:
        """Every queue in the ``queues`` SET, sorted by name."""
        cfg = resolve(config)
        names = runtime_for(cfg).pool.run(lambda c: sscan_all(c, keys.QUEUES), idempotent=True)
        return [cls(name, config=cfg) for name in names]

    @classmethod
    def get(cls, name: str, *, must_exist: bool = False,
            config: Config | None = None) -> Queue:
        """The queue ``name``; with ``must_exist``, raise unless ``queues`` lists it."""
        queue = cls(name, config=config)
        if must_exist and not queue.exists:
            raise UnknownQueueError(name)
        return queue

    @property
    def exists(self) -> bool:
        """Listed in ``queues`` (a queue may be known and empty)."""
        pool = self.runtime.pool
        return bool(pool.call("SISMEMBER", keys.QUEUES, self.name, idempotent=True))

    @property
    def size(self) -> int:
        return int(self.runtime.pool.call("LLEN", self.key, idempotent=True))

    def __len__(self) -> int:
        return self.size

    @property
    def latency(self) -> float:
        oldest = self.runtime.pool.call("LINDEX", self.key, -1, idempotent=True)
        return latency_of(oldest)

    # -- pause (the Pro ``paused`` SET, spec §12) -----------------------
    @property
    def paused(self) -> bool:
        return bool(self.runtime.pool.call("SISMEMBER", keys.PAUSED, self.name,
                                          idempotent=True))

    def pause(self) -> None:
        """Fetchers stop taking from this queue (within a second); running jobs go on."""
        # Replay-safe: adding a member that is already there changes nothing.
        self.runtime.pool.call("SADD", keys.PAUSED, self.name, idempotent=True)

    def unpause(self) -> None:
        # Replay-safe: removing an absent member changes nothing.
        self.runtime.pool.call("SREM", keys.PAUSED, self.name, idempotent=True)

    # -- browsing ---------------------------------------------------------
    def __iter__(self) -> Iterator[JobRecord]:
        """Newest first, a page of 50 per round trip.

        As Sidekiq: the next page starts earlier by however much the list
        shrank meanwhile, so deleting the records while iterating skips none.
        A live queue moves under the cursor; a job may show twice or not at all.
        """
        initial = self.size
        page = shrunk = 0
        while True:
            start = page * PAGE_SIZE - shrunk
            values = self._range(start, start + PAGE_SIZE - 1)
            if not values:
                return
            page += 1
            for value in values:
                yield JobRecord(value, self.name, config=self.config)
            shrunk = max(0, initial - self.size)

    def _range(self, start: int, stop: int) -> list[Any]:
        replies: list[Any] = self.runtime.pool.call("LRANGE", self.key, max(0, start), stop,
                                                   idempotent=True)
        return replies

    def find_job(self, jid: str, *, must_exist: bool = False) -> JobRecord | None:
        """The queued job with ``jid`` (a full scan: an operator's tool, not app logic)."""
        found = next((record for record in self if record.jid == jid), None)
        if found is None and must_exist:
            raise JobNotFoundError(jid, f"queue {self.name!r}")
        return found

    def clear(self) -> int:
        """Drop every job and forget the queue name, as Sidekiq's Queue#clear; how
        many jobs this call removed.

        Unlike Sidekiq's UNLINK, each job ends with what it holds (its unique
        lock, its batch count, its result waiters: ``wurk.api.removal``), a
        chunk of jobs per script, so a big queue never holds Redis for long.
        Jobs pushed meanwhile stay.
        """
        return removal.clear(self.runtime, self.key, queue=self.name)


"""Basic fetch: take the next job from the configured queues with BRPOP.

Duties:
1. Ask Redis for the queues in the plan's order (strict, or a weighted
   shuffle on every call), skipping queues listed in the ``paused`` set.
2. Hand back a :class:`UnitOfWork` holding the raw payload bytes untouched,
   so a requeue or a dead entry is byte-for-byte what was fetched.
3. Requeue unfinished work to the oldest end (RPUSH) so it runs next.
4. Settle a failed job: write its retry or dead entry (``wurk.runtime.settle``);
   there is nothing to acknowledge.

A BRPOP is destructive, so it is never replayed after its reply may have
been lost; reliable fetch (a private working list) closes that gap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from wurk.redis.runtime import Runtime, handed
from wurk.runtime import settle
from wurk.runtime.work import Sender, UnitOfWork
from wurk.settings.queues import QueuePlan
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.runtime.work import Settlement
    from wurk.settings.config import Config

PAUSED_REFRESH = 1.0


class PausedQueues:
    """The ``paused`` set, re-read at most once a second and shared by all fetchers."""

    def __init__(self, config: Config, clock: Any = time.monotonic,
                 *, runtime: Runtime | None = None) -> None:
        self._config = config
        self.runtime = handed(runtime, config)
        self._clock = clock
        self._names: frozenset[str] = frozenset()
        self._expires = 0.0
        self._lock = threading.Lock()

    def current(self) -> frozenset[str]:
        now = self._clock()
        if now >= self._expires:
            with self._lock:
                if now >= self._expires:
                    members = self.runtime.pool.call("SMEMBERS", keys.PAUSED, idempotent=True)
                    self._names = frozenset(m.decode() for m in members)
                    self._expires = now + PAUSED_REFRESH
        return self._names


class BasicFetch:
    def __init__(self, config: Config, plan: QueuePlan, *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.plan = plan
        self.paused = PausedQueues(config, runtime=self.runtime)
        timeout = config.fetch_timeout
        # Sidekiq sends an integer; Redis 6+ also takes a decimal.
        self._block_arg: int | float = int(timeout) if float(timeout).is_integer() else timeout
        self._read_timeout = timeout + config.redis_read_timeout

    def fetch(self) -> UnitOfWork | None:
        """The next job, or None when nothing arrived within ``fetch_timeout``."""
        paused = self.paused.current()
        names = [q for q in self.plan.order() if q not in paused]
        if not names:
            time.sleep(self.config.fetch_timeout)
            return None
        args = ["BRPOP", *(keys.queue(q) for q in names), self._block_arg]
        reply = self.runtime.pool.run(lambda c: c.call(*args, timeout=self._read_timeout))
        if reply is None:
            return None
        key, raw = reply
        return UnitOfWork(key.decode()[len("queue:"):], raw)

    def start(self) -> None:
        """Nothing to start: each processor thread fetches for itself."""

    def quiet(self) -> None:
        """Nothing to do: each thread stops asking once the manager is quiet."""

    def stop(self) -> None:
        """Nothing to hand back: a BRPOP takes one job for a thread that runs it."""

    def acknowledge(self, work: UnitOfWork, jid: str | None = None,
                    send: Sender | None = None) -> None:
        """Nothing to do: BRPOP already removed the job from Redis."""

    def settle(self, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
        """Write a failed job's entry: BRPOP left no copy to remove."""
        return settle.write(self.runtime, settlement)

    def requeue(self, works: Iterable[UnitOfWork]) -> int:
        commands = [w.requeue_command() for w in works]
        if commands:
            self.runtime.pool.pipeline(commands)
        return len(commands)

"""The testing mode's clients: the real push pipeline, with a writer that keeps jobs in memory.

A push in testing mode takes the way every push takes
(:mod:`wurk.push.pipeline`): normalise (the same checks, so arguments a
real push refuses are refused), the application's client middleware, then
the built-in steps and the write. Only the last two differ:

1. The unique lock is taken in memory (:class:`~wurk.testing.box.Box`), on
   the key a real push would lock, for the same time; a duplicate push
   returns None as it would.
2. The writer (:class:`MemoryWriter`) serialises the jobs exactly as a real
   write would, then hands them to the box instead of Redis.
3. The pool is :class:`NoRedis`: anything that still tries to reach Redis
   (a middleware given ``redis``, a batch's own script) fails loudly with
   :class:`NoRedisError` instead of connecting, so a test never needs, or
   touches, a Redis server.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast

from wurk.batches.keys import FIELD as BATCH_FIELD
from wurk.push.client import Client
from wurk.push.confirmed import ConfirmedPush
from wurk.push.exchange import Flow
from wurk.push.pipeline import Pipeline
from wurk.push.prepare import Prepared
from wurk.push.writer import Writer
from wurk.settings.config import Config
from wurk.unique import keys as unique
from wurk.unique import push as push_unique

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool
    from wurk.testing.box import Box


class NoRedisError(RuntimeError):
    """Something in testing mode tried to reach Redis, which the mode never does."""


class NoRedis:
    """A pool that refuses every use: testing mode has no Redis."""

    def __getattr__(self, name: str) -> NoReturn:
        raise NoRedisError(f"wurk.testing: this would reach Redis (pool.{name}), which "
                           "testing mode never does; see docs/how-to/testing.md for what "
                           "the mode covers")

    def __bool__(self) -> bool:
        return True


class MemoryWriter(Writer):
    """The pipeline's writer for testing mode: the jobs go to the box."""

    def __init__(self, box: Box) -> None:
        super().__init__(buffered=False, confirmed=None, tries=1, rerun=_never)
        self.box = box
        # The built-in steps that would ask Redis do not run: the unique lock
        # is taken in memory (:class:`MemoryPipeline`), batches are not faked.
        self.skip = (unique.FOR, BATCH_FIELD)

    def write(self, content: ConfirmedPush, payloads: Sequence[dict[str, Any]] = ()
              ) -> Flow[Any]:
        yield from ()  # a flow with no trip: nothing is sent
        self.box.add(content.jobs)
        return len(content.jobs)


def _never(flow: Flow[Any]) -> object:
    raise NoRedisError("wurk.testing: a write was sent again, which testing mode never does")


class MemoryPipeline(Pipeline):
    """The push pipeline with the unique lock taken in the box."""

    def __init__(self, config: Config, writer: MemoryWriter) -> None:
        super().__init__(config, None, writer)
        self.box = writer.box

    def send(self, batch: list[Prepared],
             content: ConfirmedPush | None = None) -> Flow[list[Prepared]]:
        return (yield from super().send(self._locked(batch), content))

    def _locked(self, batch: list[Prepared]) -> list[Prepared]:
        """The jobs of ``batch`` whose lock is free (taking it), as the lock step decides."""
        now = time.time()
        kept: list[Prepared] = []
        for payload, run_at in batch:
            ttl = payload.get(unique.FOR)
            if ttl is not None and ttl is not False:
                if not unique.is_unique(payload):
                    raise TypeError(f"unique_for must be a positive finite number of "
                                    f"seconds, got {ttl!r}; nothing was pushed")
                key = payload[unique.LOCK] = push_unique.key_for(payload)
                seconds = push_unique.ttl_ms(float(ttl), run_at, now) / 1000
                if self.box.lock_held(key, str(payload["jid"]), seconds, now):
                    continue  # a duplicate: not written, the push returns None
            kept.append((payload, run_at))
        return kept


class MemoryClient(Client):
    """:class:`wurk.Client` on the memory writer; it never opens a connection."""

    def __init__(self, config: Config, box: Box) -> None:
        super().__init__(config, pool=cast("RedisPool", NoRedis()), buffered=False,
                         drain_spool=False)
        self.box = box
        self.writer = MemoryWriter(box)
        self.pipeline = MemoryPipeline(config, self.writer)
        self.pipeline.normalise = self._normalise

    def follow(self, config: Config) -> None:
        """Push on ``config`` (its middleware, its checks) from now on: the
        same object, so wherever it is installed keeps working."""
        MemoryClient.__init__(self, config, self.box)


class MemoryAsyncClient:
    """The a-verbs' client in testing mode: the memory client's pushes, awaited."""

    def __init__(self, client: MemoryClient) -> None:
        self.client = client

    @property
    def config(self) -> Config:
        return self.client.config

    async def push_job(self, name: str, args: list[Any], options: JobOptions, *,
                       delay: float | None = None, at: float | None = None) -> str | None:
        return self.client.push_job(name, args, options, delay=delay, at=at)

    async def push(self, item: Mapping[str, Any]) -> str | None:
        return self.client.push(item)

    async def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        return self.client.push_bulk(item)

"""The asyncio client: the sync client's pushes, awaited on ``redis.asyncio``.

``await client.push(item)`` and ``await client.push_bulk(item)`` take the
items :class:`wurk.Client` takes and write the same payloads
(:mod:`wurk.push.prepare` builds both), so a worker cannot tell which
pushed. Jobs get the awaitable verbs ``aperform_async``, ``aperform_in``,
``aperform_at`` and ``aperform_bulk`` (:mod:`wurk.push.job`), which push
through :meth:`AsyncClient.default`.

Duties:
1. Push one job or many (a thousand per round trip), immediate or
   scheduled, on an :class:`~wurk.redis.apool.AsyncRedisPool` built from the
   same settings as the sync pool; never block the event loop waiting for
   Redis, and let any number of coroutines push at once.
2. Drive the sync client's push pipeline (:mod:`wurk.push.pipeline`) on
   this pool (:func:`wurk.push.exchange.adrive`): the same normalising, the
   application's client middleware (sync: it must not block), the same
   built-in steps and the same writer, so the same commands reach Redis.
3. Keep the sync client's apply-safety (:mod:`wurk.push.landing`): a lost
   reply is replayed without a twin; one that stays unknown raises
   :class:`~wurk.push.landing.PushOutcomeUnknown`.
4. With ``reliable_push``, hold pushes in an
   :class:`~wurk.push.abuffered.AsyncPushBuffer` while Redis is
   unreachable; ``aclose`` flushes it and spools what is left.
5. With ``push_replicas``, write through the confirmed writer and WAIT;
   unconfirmed pushes raise :class:`~wurk.push.confirmed.PushNotConfirmedError`
   (or wait in the buffer and are sent again, as in the sync client).
6. One default client per running event loop (:meth:`AsyncClient.default`).
7. At start, have what earlier processes left in the spool pushed in the
   background (a thread, as the sync client does), unless told not to.
8. A push a middleware deferred (``wurk.push.middleware.defer``) returns its
   jid; its resume, called later from any thread (Django's ``on_commit``),
   pushes it on this client's loop (:meth:`AsyncClient._resumer`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push import prepare, writer
from wurk.push.abuffered import AsyncPushBuffer
from wurk.push.buffered import send_timeout
from wurk.push.confirmed import ConfirmedWriter
from wurk.push.exchange import Aside, Flow, adrive
from wurk.push.nowhere import Notice
from wurk.push.pipeline import Pipeline
from wurk.push.spool import Destination
from wurk.push.spool_drain import drain_at_start
from wurk.push.writer import Hand
from wurk.redis.apool import AsyncRedisPool
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config, default_config
from wurk.settings.hooks import ClientMiddleware

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool

log = get_logger("wurk.client")
T = TypeVar("T")


class AsyncClient:
    """Pushes jobs from async code. Belongs to the event loop that first uses it."""

    # The testing mode's client (``wurk.testing``), as ``Client.stand_in``.
    stand_in: ClassVar[AsyncClient | None] = None

    def __init__(self, config: Config | None = None, *, pool: AsyncRedisPool | None = None,
                 buffered: bool | None = None, drain_spool: bool = True,
                 middleware: Sequence[ClientMiddleware] | None = None) -> None:
        self.config = c = config or default_config()
        # Its sync pool (the spool drain's, the middleware's), looked up once.
        self.runtime = runtime_for(c)
        self.pool = pool or AsyncRedisPool.from_config(c)
        spool, replay = Destination.of(c), self.pool.replay
        self.buffer = (AsyncPushBuffer(c.push_buffer_size, c.push_flush_timeout,
                                       self.pool.on_error, spool=spool,
                                       send_timeout=send_timeout(c),
                                       notice=Notice(self.pool.url, lambda: replay.answered,
                                                     spool))
                       if (c.reliable_push if buffered is None else buffered) else None)
        self.writer = writer.for_config(c, buffered=self.buffer is not None,
                                        rerun=lambda flow: adrive(self.pool, flow))
        self.pipeline = Pipeline(c, middleware, self.writer)
        if drain_spool:
            # What earlier processes spooled, pushed by a thread of its own (as
            # the sync client does): nothing of it runs on the loop.
            drain_at_start(self.config, self.runtime.pool)

    @classmethod
    def default(cls) -> AsyncClient:
        """The running loop's client on the default config (a new one after ``configure``)."""
        if AsyncClient.stand_in is not None:
            return AsyncClient.stand_in
        loop = asyncio.get_running_loop()
        client = _defaults.get(loop)
        if client is None or client.config is not default_config():
            client = _defaults[loop] = cls()
        return client

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Flush the push buffer (spooling what Redis did not take) and close the pool."""
        if self.buffer is not None:
            await self.buffer.aclose()
        await self.pool.close()

    # -- pushing -----------------------------------------------------------
    async def push_job(self, name: str, args: list[Any], options: JobOptions, *,
                       delay: float | None = None, at: float | None = None) -> str | None:
        return await self.push(prepare.job_item(name, args, options, delay=delay, at=at))

    async def push(self, item: Mapping[str, Any]) -> str | None:
        """Push one job, as :meth:`wurk.Client.push`: the jid, or None when a
        client middleware (or the unique lock) stopped it; a deferred push's jid."""
        routed = self.pipeline.route(item, time.time(), self._middleware_pool(),
                                     self._resumer(asyncio.get_running_loop()))
        if not isinstance(routed, tuple):
            return routed  # None (stopped) or the jid of a deferred push
        return str(routed[0]["jid"]) if await self._drive(self.pipeline.send([routed])) else None

    async def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class, as :meth:`wurk.Client.push_bulk`."""
        jids: list[str] = []
        for piece in self.pipeline.slices(item, time.time(), self._middleware_pool(),
                                          self._resumer(asyncio.get_running_loop())):
            jids += await self._drive(self.pipeline.send_slice(piece))
            # A thousand jobs of CPU work: let the loop's other tasks run between slices.
            await asyncio.sleep(0)
        return jids

    @property
    def confirmed(self) -> ConfirmedWriter | None:
        """The replica-confirmed writer, when ``push_replicas`` asks for one."""
        return self.writer.confirmed

    def _middleware_pool(self) -> RedisPool | None:
        # The chain is sync, and gets the sync pool: a middleware that uses it blocks the loop.
        return self.runtime.pool if self.pipeline.chain() else None

    def _resumer(self, loop: asyncio.AbstractEventLoop) -> Callable[[dict[str, Any]], object]:
        """The resume of a deferred push: a sync call that pushes the payload on
        ``loop`` (this client's pool lives there), in the caller's context.
        From another thread it waits for the push and returns its jid (or
        raises what the push raised); on the loop's own thread it cannot wait,
        so it returns the push's task, whose failure is logged."""

        def resume(payload: dict[str, Any]) -> object:
            context = contextvars.copy_context()
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                task = loop.create_task(self.push(payload), context=context)
                task.add_done_callback(_log_failure)
                return task
            if loop.is_closed():
                raise RuntimeError(f"deferred push of {payload.get('jid')}: the AsyncClient's "
                                   "event loop is closed; nothing was written")
            done: concurrent.futures.Future[str | None] = concurrent.futures.Future()

            def start() -> None:
                loop.create_task(self.push(payload)).add_done_callback(
                    lambda task: _settle(task, done))

            loop.call_soon_threadsafe(start, context=context)
            return done.result()

        return resume

    # -- driving the pipeline's flows ----------------------------------------
    async def _drive(self, flow: Flow[T]) -> T:
        return await adrive(self.pool, flow, self._hand)

    async def _hand(self, hand: Aside) -> None:
        """A buffered push: the buffer sends it now, or keeps it while Redis is away."""
        assert isinstance(hand, Hand) and self.buffer is not None
        await self.buffer.send(hand.pending(lambda attempts: adrive(self.pool,
                                                                    hand.flow(attempts))))


_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
    weakref.WeakKeyDictionary())


async def close_default() -> None:
    """``aclose`` the running loop's default client, if it made one (an app's lifespan end)."""
    client = _defaults.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


def _settle(task: asyncio.Task[str | None], done: concurrent.futures.Future[str | None]) -> None:
    if task.cancelled():
        done.cancel()
    elif (exc := task.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(task.result())


def _log_failure(task: asyncio.Task[str | None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("client.deferred_push_failed", error=describe(exc))

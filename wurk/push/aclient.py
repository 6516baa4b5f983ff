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
2. Run the application's client middleware (sync: it must not block), then
   the built-in steps through this pool (``aadmit``: the unique lock, the
   same script the sync client runs); give back what they took for a push
   that is not written.
3. Keep the sync client's apply-safety: an immediate push is never replayed
   after a round trip may have landed; a scheduled ZADD may be.
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push import batch_step, bulk_template, middleware, prepare
from wurk.push.abuffered import AsyncPushBuffer
from wurk.push.buffered import PendingPush
from wurk.push.confirmed import ConfirmedPush, ConfirmedWriter, PushNotConfirmedError
from wurk.push.prepare import Prepared
from wurk.push.spool import Destination
from wurk.push.spool_drain import drain_at_start
from wurk.redis.apool import AsyncRedisPool
from wurk.redis.pools import pool_for
from wurk.settings.config import Config, default_config
from wurk.settings.hooks import ClientMiddleware
from wurk.wire.batch import FIELD as BATCH_FIELD

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool

log = get_logger("wurk.client")


class AsyncClient:
    """Pushes jobs from async code. Belongs to the event loop that first uses it."""

    def __init__(self, config: Config | None = None, *, pool: AsyncRedisPool | None = None,
                 buffered: bool | None = None, drain_spool: bool = True,
                 middleware: Sequence[ClientMiddleware] | None = None) -> None:
        self.config = config or default_config()
        self.pool = pool or AsyncRedisPool.from_config(self.config)
        self._middleware = None if middleware is None else list(middleware)
        c = self.config
        use_buffer = c.reliable_push if buffered is None else buffered
        # One send: a dial, a reply, and the replicas' confirmation.
        send_timeout = c.redis_connect_timeout + c.redis_read_timeout + c.push_replicas_timeout
        self.buffer = (AsyncPushBuffer(c.push_buffer_size, c.push_flush_timeout,
                                       self.pool.on_error, spool=Destination.of(c),
                                       send_timeout=send_timeout)
                       if use_buffer else None)
        replicas = c.replicas_to_confirm
        self.confirmed = (ConfirmedWriter(replicas, c.push_replicas_timeout,
                                          c.redis_read_timeout)
                          if replicas else None)
        if drain_spool:
            # What earlier processes spooled, pushed by a thread of its own (as
            # the sync client does): nothing of it runs on the loop.
            drain_at_start(self.config, pool_for(self.config))

    @classmethod
    def default(cls) -> AsyncClient:
        """The running loop's client on the default config (a new one after ``configure``)."""
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
        now = time.time()
        prepared = self._through_middleware(self._normalise(item, now), now)
        if not isinstance(prepared, tuple):
            return prepared  # None (stopped) or the jid of a deferred push
        return str(prepared[0]["jid"]) if await self._admit_and_write([prepared]) else None

    async def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class, as :meth:`wurk.Client.push_bulk`."""
        now = time.time()
        jids: list[str] = []
        if bulk_template.applies(item, self._chain()):
            pushes = bulk_template.slices(item, now, self.config.timestamps)
            if pushes is not None:
                for push in pushes:
                    try:
                        await self._write(push)
                    except BaseException as exc:
                        # Nothing to give back; said as every other push says it.
                        await middleware.aunwritten(({"jid": jid} for jid in push.jids),
                                                    self.pool, self._sync_pool,
                                                    written_error=exc)
                        raise
                    jids += push.jids
                    await asyncio.sleep(0)  # let the loop's other tasks run between slices
                return jids
        for items in prepare.bulk_slices(item, now, self.config.timestamps):
            bulk = prepare.BulkSlice()
            for one in items:
                bulk.add(self._through_middleware(self._normalise(one, now, checked=True), now))
            jids += bulk.jids(await self._admit_and_write(bulk.batch))
            # A thousand jobs of CPU work: let the loop's other tasks run between slices.
            await asyncio.sleep(0)
        return jids

    def _normalise(self, item: Mapping[str, Any], now: float, *,
                   checked: bool = False) -> Prepared:
        return prepare.normalise(item, now, self.config.timestamps, checked=checked)

    def _sync_pool(self) -> RedisPool:
        return pool_for(self.config)

    def _chain(self) -> Sequence[ClientMiddleware]:
        return self.config.client_middleware if self._middleware is None else self._middleware

    def _through_middleware(self, prepared: Prepared, now: float) -> Prepared | str | None:
        chain = self._chain()
        # The chain is sync, and gets the sync pool: a middleware that uses it blocks the loop.
        return prepare.through_middleware(chain, prepared, now, self.config.timestamps,
                                          self._sync_pool() if chain else None,
                                          resume=self._resumer(asyncio.get_running_loop()))

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

    async def _admit_and_write(self, batch: list[Prepared]) -> list[Prepared]:
        """The built-in steps, then the write; what the steps took is given back on
        failure. Returns the payloads written."""
        admitted: list[Prepared] = []
        sent = False
        # A plain write counts batch jobs in the write itself (batch_step.awrite).
        skip = (BATCH_FIELD,) if self.buffer is None and self.confirmed is None else ()
        try:
            admitted = await middleware.aadmit(batch, self.pool, self._sync_pool, skip)
            if admitted:
                sent = True
                if skip and any(BATCH_FIELD in p for p, _ in admitted):
                    await batch_step.awrite(prepare.as_push(admitted),
                                            (p for p, _ in admitted), self.pool)
                else:
                    await self._write(prepare.as_push(admitted))
        except BaseException as exc:
            await middleware.aunwritten((p for p, _ in admitted or batch), self.pool,
                                        self._sync_pool, skip=skip,
                                        written_error=exc if sent else None)
            raise
        return admitted

    # -- writing -----------------------------------------------------------
    async def _write(self, content: ConfirmedPush) -> None:
        send = self._sender(content)
        if self.buffer is not None:
            # An unconfirmed push waits in the buffer, sent again (a no-op
            # where it landed) until replicas confirm it.
            await self.buffer.send(PendingPush(send, content.jids,
                                               replayable=self.confirmed is not None,
                                               content=content))
            return
        # Unbuffered, a confirmed push gets redis_retry_attempts tries, each
        # waiting push_replicas_timeout; a plain one raises what it met.
        tries = self.config.redis_retry_attempts if self.confirmed is not None else 1
        for left in reversed(range(tries)):
            try:
                await send(None)
                return
            except PushNotConfirmedError:
                if not left:
                    raise

    def _sender(self, content: ConfirmedPush) -> Callable[[int | None], Awaitable[object]]:
        """Sends ``content`` once; the argument caps the pool's attempts (None: its default)."""
        writer = self.confirmed
        if writer is not None:
            return lambda attempts: writer.awrite(self.pool, content, attempts=attempts)
        commands, idempotent = prepare.plain_commands(content)
        return lambda attempts: self.pool.pipeline(commands, idempotent=idempotent,
                                                   attempts=attempts)


_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
    weakref.WeakKeyDictionary())


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

"""The asyncio Redis pool: ``redis.asyncio`` connections under the same
apply-safety policy as :mod:`wurk.redis.pool`.

Duties:
1. Read the URL as the sync pool does (AUTH and ACL users, db, ``rediss://``
   TLS, unix sockets) with the same timeouts, RESP2 and redis-py's own
   retries off; follow a Sentinel master through ``redis.asyncio.sentinel``.
2. Dial before sending, so a failed dial is a
   :class:`~wurk.redis.policy.ConnectError` (nothing applied); count
   completed round trips; re-dial an idle socket the server closed while
   that is still safe.
3. Run a block and replay it only where
   :func:`~wurk.redis.policy.retry_plan` allows, pausing with
   ``asyncio.sleep`` (never blocking the loop); report each retry and
   give-up to ``on_redis_error`` exactly as the sync pool does.
4. Bound the pool: at most ``size`` connections; a checkout waits up to the
   checkout timeout, then raises :class:`~wurk.redis.policy.PoolExhausted`.
5. A block cancelled mid-command closes its connection (its stream may be
   out of step) and is never replayed.

A pool belongs to the event loop that first used it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import redis.asyncio as aredis
import redis.exceptions as rx
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from wurk.redis.connection import quiet_and_open
from wurk.redis.limits import Deadline
from wurk.redis.policy import ConnectError, ErrorKind, Plan, PoolExhausted, classify, retry_plan
from wurk.redis.pool import ReplayReporter, RetrySettings, _report_default, settings_of
from wurk.redis.sentinel import SentinelSettings
from wurk.settings.hooks import RedisErrorHook

if TYPE_CHECKING:
    from wurk.settings.config import Config

T = TypeVar("T")


class Scripted(Protocol):
    """A Lua script run by SHA (:class:`wurk.wire.lua.Script`)."""

    @property
    def sha(self) -> str: ...

    @property
    def source(self) -> str: ...


class AsyncConn:
    """One checked-out ``redis.asyncio`` connection. Dials before sending and counts round trips."""

    def __init__(self, raw: Any, on_redial: Callable[[], None]) -> None:
        self.raw = raw
        self.round_trips = 0
        self._on_redial = on_redial

    async def _dial(self) -> None:
        raw = self.raw
        if raw.is_connected:
            if not _server_closed(raw):
                return
            await raw.disconnect(nowait=True)
            self._on_redial()
        try:
            await raw.connect()
        except (rx.AuthenticationError, rx.AuthorizationError):
            raise
        except (rx.RedisError, OSError) as exc:
            raise ConnectError(f"cannot connect to Redis: {exc}") from exc

    async def call(self, *args: Any, timeout: float | None = None) -> Any:
        """Send one command and return its reply; an error reply is raised."""
        (reply,) = await self.pipeline([args], timeout=timeout)
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Any]], *,
                       raise_on_error: bool = True, timeout: float | None = None) -> list[Any]:
        """Send many commands in one write and read every reply: one round trip.

        Error replies are returned in place, or the first is raised after
        every reply was read, keeping the stream in step.
        """
        if not commands:
            return []
        await self._dial()
        await self.raw.send_packed_command(self.raw.pack_commands(commands), check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await self.raw.read_response(timeout=timeout))
            except rx.ResponseError as exc:
                replies.append(exc)
        # A batch refused outright (READONLY & co) applied nothing: the block stays clean.
        if not all(isinstance(r, rx.ResponseError) and classify(r) is ErrorKind.FAILOVER
                   for r in replies):
            self.round_trips += 1
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, rx.ResponseError):
                    raise reply
        return replies

    async def script(self, script: Scripted, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA; on NOSCRIPT (a restarted or flushed Redis, nothing ran) load and go again."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self.call(*command)
        except rx.NoScriptError:
            await self.call("SCRIPT", "LOAD", script.source)
        return await self.call(*command)

    async def close(self) -> None:
        await self.raw.disconnect(nowait=True)


def _server_closed(raw: Any) -> bool:
    """True when an idle socket must be re-dialed: EOF, an error, or bytes nobody
    asked for. The loop may not have read the server's FIN yet (it stopped a
    moment ago), so the socket itself is peeked too, without blocking."""
    reader, writer = raw._reader, raw._writer
    if reader is None or writer is None or writer.transport.is_closing():
        return True
    if reader.at_eof() or len(reader._buffer):
        return True
    sock = writer.get_extra_info("socket")
    if sock is None or quiet_and_open is None:
        return False
    try:
        return not quiet_and_open(sock.fileno())
    except OSError:
        return True


class AsyncRedisPool(ReplayReporter):
    """A bounded pool of :class:`AsyncConn` with the apply-safety policy on top."""

    def __init__(self, url: str, *, size: int = 10, connect_timeout: float = 1.0,
                 read_timeout: float = 2.5, retry: RetrySettings | None = None,
                 on_error: RedisErrorHook | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 sentinel: SentinelSettings | None = None) -> None:
        self.url = url
        self.size = size
        self.retry = retry or RetrySettings()
        self.on_error = on_error or _report_default
        self.deadline = Deadline()  # never set: no drain deadline in an event loop
        self._rng = random.Random()
        self._sleep = sleep
        self.disruptions = 0
        template = aredis.ConnectionPool.from_url(
            url, socket_connect_timeout=connect_timeout, socket_timeout=read_timeout,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
            protocol=2)
        if sentinel is not None:
            template = sentinel.async_pool_template(template.connection_kwargs, connect_timeout)
        # Kept: a Sentinel connection reaches its manager through this pool.
        self._template = template
        self._idle: list[AsyncConn] = []
        self._slots = asyncio.Semaphore(size)

    @classmethod
    def from_config(cls, config: Config) -> AsyncRedisPool:
        return cls(config.redis_url, **settings_of(config))

    def _note_disruption(self) -> None:
        self.disruptions += 1

    async def _checkout(self) -> AsyncConn:
        try:
            if self._slots.locked():
                async with asyncio.timeout(self.retry.checkout_timeout):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()  # free: no timer to arm
        except TimeoutError:
            exc = PoolExhausted(f"no Redis connection free in {self.size}-slot pool")
            self.on_error(exc, attempt=1, action="give_up")
            raise exc from None
        if self._idle:
            return self._idle.pop()
        template = self._template
        return AsyncConn(template.connection_class(**template.connection_kwargs),
                         self._note_disruption)

    def _checkin(self, conn: AsyncConn) -> None:
        self._idle.append(conn)
        self._slots.release()

    async def run(self, block: Callable[[AsyncConn], Awaitable[T]], *, idempotent: bool = False,
                  attempts: int | None = None) -> T:
        """Run ``await block(conn)``, replaying it only where :func:`retry_plan` allows."""
        conn = await self._checkout()
        try:
            return await self._run_on(conn, block, idempotent, attempts or self.retry.max_attempts)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                await conn.close()  # cancelled mid-command: the stream may be out of step
            raise
        finally:
            self._checkin(conn)

    async def _run_on(self, conn: AsyncConn, block: Callable[[AsyncConn], Awaitable[T]],
                      idempotent: bool, max_attempts: int) -> T:
        for attempt in range(1, max_attempts + 2):
            odometer = conn.round_trips
            try:
                return await block(conn)
            except Exception as exc:
                kind = classify(exc)
                if kind is not ErrorKind.OTHER:
                    await conn.close()
                    self._note_disruption()
                plan = retry_plan(kind, attempt, max_attempts, idempotent=idempotent,
                                  dirty=conn.round_trips != odometer)
                delay = None if plan is Plan.PROPAGATE else self.replay_delay(exc, plan, attempt)
                if delay is None:
                    raise
                await self._sleep(delay)
        raise AssertionError("retry_plan ends every run within max_attempts")  # pragma: no cover

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, idempotent: bool = False,
                       attempts: int | None = None) -> list[Any]:
        return await self.run(lambda c: c.pipeline(commands), idempotent=idempotent,
                              attempts=attempts)

    async def call(self, *args: Any, idempotent: bool = False) -> Any:
        return await self.run(lambda c: c.call(*args), idempotent=idempotent)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
        # With Sentinel, the manager's own connections to the sentinels too.
        manager = getattr(self._template, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()

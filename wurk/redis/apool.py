"""The asyncio Redis pool: ``redis.asyncio`` connections, the asyncio driver of
the :class:`~wurk.redis.replay.Replay` the sync pool (:mod:`wurk.redis.pool`) drives.

Duties:
1. Dial from the template the sync pool uses (:mod:`wurk.redis.sentinel`,
   in its asyncio flavour): the same URL, timeouts, RESP2, redis-py's
   retries off, a Sentinel master followed.
2. Dial before sending and count completed round trips, as
   :class:`~wurk.redis.connection.Conn` does and with its reply rules;
   re-dial an idle socket the server closed while that is still safe.
3. Run a block and replay it only where its replay judges it safe, pausing
   with ``asyncio.sleep`` (never blocking the loop).
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

import redis.exceptions as rx

from wurk.redis.connection import applied, dialing, outcome, peer_closed
from wurk.redis.policy import PoolExhausted
from wurk.redis.replay import Replay, RetrySettings, pool_settings
from wurk.redis.sentinel import ASYNC, SentinelSettings, connection_template
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
        with dialing():
            await raw.connect()

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
        if applied(replies, transaction=False):
            self.round_trips += 1
        return outcome(replies, transaction=False, raise_on_error=raise_on_error)

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
    return bool(peer_closed(writer.get_extra_info("socket")))


class AsyncRedisPool:
    """A bounded pool of :class:`AsyncConn` with the apply-safety policy on top."""

    def __init__(self, url: str, *, size: int = 10, connect_timeout: float = 1.0,
                 read_timeout: float = 2.5, retry: RetrySettings | None = None,
                 on_error: RedisErrorHook | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None,
                 sentinel: SentinelSettings | None = None) -> None:
        self.url = url
        self.size = size
        self.replay = Replay(retry, on_error, rng)
        self.retry, self.on_error = self.replay.retry, self.replay.on_error
        self.deadline = self.replay.deadline  # never set: no drain deadline in an event loop
        self._sleep = sleep
        # Kept: a Sentinel connection reaches its manager through this pool.
        self._template = connection_template(url, ASYNC, connect_timeout=connect_timeout,
                                             read_timeout=read_timeout, sentinel=sentinel)
        self._idle: list[AsyncConn] = []
        self._slots = asyncio.Semaphore(size)

    @classmethod
    def from_config(cls, config: Config) -> AsyncRedisPool:
        return cls(config.redis_url, **pool_settings(config))

    @property
    def disruptions(self) -> int:
        """Connections dropped for Redis trouble so far (see ``RedisPool.disruptions``)."""
        return self.replay.disruptions

    async def _checkout(self) -> AsyncConn:
        try:
            if self._slots.locked():
                async with asyncio.timeout(self.replay.checkout_timeout()):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()  # free: no timer to arm
        except TimeoutError:
            exc = PoolExhausted(f"no Redis connection free in {self.size}-slot pool")
            self.replay.starved(exc, 1, tries=1)  # a waiting coroutine costs nothing: no retry
            raise exc from None
        if self._idle:
            return self._idle.pop()
        template = self._template
        return AsyncConn(template.connection_class(**template.connection_kwargs),
                         self.replay.note_disruption)

    def _checkin(self, conn: AsyncConn) -> None:
        self._idle.append(conn)
        self._slots.release()

    async def run(self, block: Callable[[AsyncConn], Awaitable[T]], *, idempotent: bool = False,
                  attempts: int | None = None) -> T:
        """Run ``await block(conn)``, replaying it only where the replay judges it safe."""
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
        attempt = 0
        while True:
            attempt += 1
            odometer = conn.round_trips
            try:
                value = await block(conn)
                self.replay.answered = True
                return value
            except Exception as exc:
                verdict = self.replay.judge(exc, attempt, max_attempts, idempotent=idempotent,
                                            dirty=conn.round_trips != odometer)
                if verdict.redial:
                    await conn.close()
                self.replay.report(exc, attempt, verdict)
                if verdict.pause is None:
                    raise
                await self._sleep(verdict.pause)  # even 0: a failover retry yields to the loop

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

"""The Redis connection pool: bounded, fork-aware, the sync driver of
:class:`~wurk.redis.replay.Replay`.

Duties:
1. Hand out connections (``with pool.conn() as conn``, ``pool.run(block)``)
   from a bounded LIFO pool; a checkout that starves is retried once.
2. Run a caller's block and replay it only where its
   :class:`~wurk.redis.replay.Replay` judges it safe (which counts the
   disruptions and reports every retry, refusal and give-up to the
   ``on_redis_error`` hook); this module does the I/O: closing, sleeping.
3. Forget every inherited socket in a forked child
   (:func:`forget_after_fork`, called by :mod:`wurk.runtime.forking`).
4. Keep every wait inside ``pool.deadline`` while one is set (a drain):
   no dial, send or retry pause starts past it, and dial, read and checkout
   timeouts are clipped to the time left (:mod:`wurk.redis.deadline`). A dial,
   TLS handshake included, is bounded by the connect timeout.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from wurk.redis.connection import Conn
from wurk.redis.deadline import bounded_dial
from wurk.redis.policy import PoolExhausted
from wurk.redis.replay import Replay, RetrySettings, pool_settings
from wurk.redis.sentinel import SYNC, SentinelSettings, connection_template
from wurk.settings.hooks import RedisErrorHook

if TYPE_CHECKING:
    from wurk.settings.config import Config

# RetrySettings too: it is the pool's argument, so callers import it from here.
__all__ = ["RedisPool", "RetrySettings", "forget_after_fork"]

T = TypeVar("T")
# A starved checkout waits its timeout, then once more after a short pause.
CHECKOUT_TRIES = 2

_live_pools: weakref.WeakSet[RedisPool] = weakref.WeakSet()


class RedisPool:
    """A bounded pool of :class:`Conn` with the apply-safety policy on top."""

    def __init__(self, url: str, *, size: int = 10, connect_timeout: float = 1.0,
                 read_timeout: float = 2.5, retry: RetrySettings | None = None,
                 on_error: RedisErrorHook | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 sentinel: SentinelSettings | None = None) -> None:
        self.url = url
        self.size = size
        self.replay = Replay(retry, on_error, rng)
        self.retry, self.on_error = self.replay.retry, self.replay.on_error
        self.deadline = self.replay.deadline
        self._sleep = sleep
        template = connection_template(url, SYNC, connect_timeout=connect_timeout,
                                       read_timeout=read_timeout, sentinel=sentinel)
        self._conn_class = bounded_dial(template.connection_class)
        self._conn_kwargs = template.connection_kwargs
        self._reset_state()
        _live_pools.add(self)

    @classmethod
    def from_config(cls, config: Config) -> RedisPool:
        return cls(config.redis_url, **pool_settings(config))

    @property
    def disruptions(self) -> int:
        """Connections dropped for Redis trouble so far. After one, the server may be
        a promoted replica or a restarted primary missing the last writes: a
        reader compares counts to know when to re-check state."""
        return self.replay.disruptions

    def _reset_state(self) -> None:
        # Idle connections wait in a SimpleQueue: its get and put are C code,
        # cheaper on every checkout than a Python Condition.
        self._idle: queue.SimpleQueue[Conn] = queue.SimpleQueue()
        self._created = 0
        self._create_lock = threading.Lock()

    # -- checkout -------------------------------------------------------
    def _checkout(self) -> Conn:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._create_lock:
            if self._created < self.size:
                self._created += 1
                return Conn(self._conn_class(**self._conn_kwargs), self.replay.note_disruption,
                            self.deadline)
        try:
            # On CPython 3.11 this may wait past its timeout, until the next
            # check-in, when another thread took the connection that woke it:
            # bounded by how long connections are held, never for good.
            return self._idle.get(timeout=self.replay.checkout_timeout())
        except queue.Empty:
            raise PoolExhausted(f"no Redis connection free in {self.size}-slot pool") from None

    def _checkin(self, conn: Conn) -> None:
        if conn.pid != os.getpid():
            return  # a connection from before the fork: never reuse it
        self._idle.put(conn)

    def idle_connections(self) -> list[Conn]:
        """A snapshot of the idle connections (for tests and diagnostics)."""
        taken = self._drain_idle()
        for conn in taken:
            self._idle.put(conn)
        return taken

    def _drain_idle(self) -> list[Conn]:
        taken: list[Conn] = []
        while True:
            try:
                taken.append(self._idle.get_nowait())
            except queue.Empty:
                return taken

    def _checkout_with_retry(self) -> Conn:
        attempt = 1
        while True:
            try:
                return self._checkout()
            except PoolExhausted as exc:
                pause = self.replay.starved(exc, attempt, CHECKOUT_TRIES)
                if pause is None:
                    raise
            self._sleep(pause)
            attempt += 1

    @contextmanager
    def conn(self) -> Iterator[Conn]:
        """A bare checkout with no replay: for callers that handle errors themselves."""
        conn = self._checkout_with_retry()
        try:
            yield conn
        except BaseException as exc:
            conn.close()
            self.replay.note_failure(exc)
            raise
        else:
            self.replay.answered = True
        finally:
            self._checkin(conn)

    # -- running blocks ---------------------------------------------------
    def run(self, block: Callable[[Conn], T], *, idempotent: bool = False,
            attempts: int | None = None) -> T:
        """Run ``block(conn)``, replaying it only where the replay judges it safe.

        ``attempts`` caps the tries for this call (the buffered client asks for
        one, so an outage is noticed at once instead of after the backoff).
        """
        conn = self._checkout_with_retry()
        try:
            return self._run_on(conn, block, idempotent, attempts or self.retry.max_attempts)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                conn.close()  # interrupted mid-command: the stream may be out of step
            raise
        finally:
            self._checkin(conn)

    def _run_on(self, conn: Conn, block: Callable[[Conn], T], idempotent: bool,
                max_attempts: int) -> T:
        attempt = 0
        while True:
            attempt += 1
            odometer = conn.round_trips
            try:
                value = block(conn)
                self.replay.answered = True
                return value
            except Exception as exc:
                verdict = self.replay.judge(exc, attempt, max_attempts, idempotent=idempotent,
                                            dirty=conn.round_trips != odometer)
                if verdict.redial:
                    conn.close()
                self.replay.report(exc, attempt, verdict)
                if verdict.pause is None:
                    raise
                if verdict.pause:
                    self._sleep(verdict.pause)

    def call(self, *args: Any, idempotent: bool = False) -> Any:
        return self.run(lambda c: c.call(*args), idempotent=idempotent)

    def pipeline(self, commands: Sequence[Sequence[Any]], *, transaction: bool = False,
                 idempotent: bool = False, attempts: int | None = None) -> list[Any]:
        return self.run(lambda c: c.pipeline(commands, transaction=transaction),
                        idempotent=idempotent, attempts=attempts)

    # -- lifecycle --------------------------------------------------------
    def close(self) -> None:
        idle = self._drain_idle()
        with self._create_lock:
            self._created -= len(idle)
        for conn in idle:
            conn.close()

    def after_fork_in_child(self) -> None:
        """Abandon the parent's sockets: close our copies, never shut them down."""
        for conn in self._drain_idle():
            # redis-py only calls shutdown() in the pid that opened the socket,
            # so this closes the child's descriptor and leaves the parent's
            # connection intact.
            conn.close()
        self._reset_state()
        self.replay.disruptions = 0  # the child's own count starts here


def forget_after_fork() -> None:
    """In a forked child: abandon every pool's inherited sockets."""
    for pool in list(_live_pools):
        pool.after_fork_in_child()

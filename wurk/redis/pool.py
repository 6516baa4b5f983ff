"""The Redis connection pool: bounded, fork-aware, with the apply-safety
policy of :mod:`wurk.redis.policy` on top.

Duties:
1. Hand out connections (``with pool.conn() as conn``, ``pool.run(block)``)
   from a bounded LIFO pool; a checkout that starves is retried once.
2. Run a caller's block and replay it only where
   :func:`~wurk.redis.policy.retry_plan` allows, counting disruptions (dropped
   connections) so readers know when to re-check state.
3. Report every retry, refusal and give-up to the ``on_redis_error`` hook.
4. Forget every inherited socket in a forked child
   (:func:`forget_after_fork`, called by :mod:`wurk.runtime.forking`).
5. Keep every wait inside ``pool.deadline`` while one is set (a drain):
   no dial, send or retry pause starts past it, and dial, read and checkout
   timeouts are clipped to the time left (:mod:`wurk.redis.limits`). A dial,
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from wurk.core.logging import get_logger
from wurk.redis.connection import Conn
from wurk.redis.limits import Deadline, bounded_dial
from wurk.redis.policy import ErrorKind, Plan, PoolExhausted, backoff_delay, classify, retry_plan
from wurk.redis.sentinel import SentinelSettings
from wurk.settings.hooks import RedisErrorHook

if TYPE_CHECKING:
    from wurk.settings.config import Config

T = TypeVar("T")


def _report_default(error: BaseException, *, attempt: int, action: str) -> None:
    get_logger("wurk.redis").warning(
        "redis.error", action=action, attempt=attempt, error=f"{type(error).__name__}: {error}"
    )


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 4
    base: float = 0.5
    cap: float = 4.0
    checkout_timeout: float = 5.0

_live_pools: weakref.WeakSet[RedisPool] = weakref.WeakSet()


def settings_of(config: Config) -> dict[str, Any]:
    """The pool arguments a config gives, but its URL (for the sync and the asyncio pool)."""
    return {
        "size": config.pool_size,
        "connect_timeout": config.redis_connect_timeout,
        "read_timeout": config.redis_read_timeout,
        "retry": RetrySettings(config.redis_retry_attempts, config.redis_retry_base,
                               config.redis_retry_cap),
        "on_error": config.on_redis_error,
        "sentinel": SentinelSettings.from_config(config),
    }


class ReplayReporter:
    """What the sync and the asyncio pool share: their retry settings, error
    hook and deadline, and the report made before each replay or give-up."""

    retry: RetrySettings
    on_error: RedisErrorHook
    deadline: Deadline
    _rng: random.Random

    def replay_delay(self, exc: Exception, plan: Plan, attempt: int) -> float | None:
        """Report the failure; return the pause before a replay, or None to raise."""
        delay = (backoff_delay(attempt, self.retry.base, self.retry.cap, self._rng)
                 if plan is Plan.BACKOFF else 0.0)
        if plan not in (Plan.FAILOVER, Plan.BACKOFF):
            action = plan.value
        elif not self.deadline.allows(delay):
            action = "deadline"  # the replay could only end after the drain's deadline
        else:
            action = "retry"
        self.on_error(exc, attempt=attempt, action=action)
        return delay if action == "retry" else None


class RedisPool(ReplayReporter):
    """A bounded pool of :class:`Conn` with the apply-safety policy on top."""

    def __init__(self, url: str, *, size: int = 10, connect_timeout: float = 1.0,
                 read_timeout: float = 2.5, retry: RetrySettings | None = None,
                 on_error: RedisErrorHook | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 sentinel: SentinelSettings | None = None) -> None:
        self.url = url
        self.size = size
        self.retry = retry or RetrySettings()
        self.on_error = on_error or _report_default
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.deadline = Deadline()
        # redis-py parses the URL (auth, db, rediss:// TLS, unix sockets);
        # we keep its connection class and kwargs and own the pooling.
        template = redis.ConnectionPool.from_url(
            url, socket_connect_timeout=connect_timeout, socket_timeout=read_timeout,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
            # RESP2, as Sidekiq speaks: reply shapes must not change with the redis-py version.
            protocol=2,
        )
        if sentinel is not None:
            template = sentinel.pool_template(template.connection_kwargs, connect_timeout)
        self._conn_class = bounded_dial(template.connection_class)
        self._conn_kwargs = template.connection_kwargs
        self._reset_state()
        _live_pools.add(self)

    @classmethod
    def from_config(cls, config: Config) -> RedisPool:
        return cls(config.redis_url, **settings_of(config))

    def _reset_state(self) -> None:
        # Bumped whenever a connection is dropped for a transient error (I/O,
        # dial, failover refusal) or found dropped by the server while idle.
        # After one, the server behind the pool may be a promoted replica or
        # a restarted primary missing the last writes; a reader compares
        # counts to know when to re-check state.
        self.disruptions = 0
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
                return Conn(self._conn_class(**self._conn_kwargs), self._note_disruption,
                            self.deadline)
        try:
            return self._idle.get(timeout=self.deadline.clip(self.retry.checkout_timeout))
        except queue.Empty:
            raise PoolExhausted(f"no Redis connection free in {self.size}-slot pool") from None

    def _note_disruption(self) -> None:
        # Unlocked: a lost increment still leaves the count changed.
        self.disruptions += 1

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
        try:
            return self._checkout()
        except PoolExhausted as exc:
            self.on_error(exc, attempt=1, action="retry")
            self._sleep(0.05 + self._rng.random() * 0.05)
        try:
            return self._checkout()
        except PoolExhausted as exc:
            self.on_error(exc, attempt=2, action="give_up")
            raise

    @contextmanager
    def conn(self) -> Iterator[Conn]:
        """A bare checkout with no replay: for callers that handle errors themselves."""
        conn = self._checkout_with_retry()
        try:
            yield conn
        except BaseException as exc:
            conn.close()
            if classify(exc) is not ErrorKind.OTHER:
                self._note_disruption()
            raise
        finally:
            self._checkin(conn)

    # -- running blocks ---------------------------------------------------
    def run(self, block: Callable[[Conn], T], *, idempotent: bool = False,
            attempts: int | None = None) -> T:
        """Run ``block(conn)``, replaying it only where :func:`retry_plan` allows.

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
                return block(conn)
            except Exception as exc:
                kind = classify(exc)
                if kind is not ErrorKind.OTHER:
                    conn.close()
                    self._note_disruption()
                plan = retry_plan(kind, attempt, max_attempts,
                                  idempotent=idempotent, dirty=conn.round_trips != odometer)
                if plan is Plan.PROPAGATE:
                    raise
                delay = self.replay_delay(exc, plan, attempt)
                if delay is None:
                    raise
                if delay:
                    self._sleep(delay)

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


def forget_after_fork() -> None:
    """In a forked child: abandon every pool's inherited sockets."""
    for pool in list(_live_pools):
        pool.after_fork_in_child()

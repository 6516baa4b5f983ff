"""The Redis connection pool and its apply-safety policy.

redis-py, left to itself, re-sends a command after a read timeout. For a job
system that is a double push or a double-counted stat, so every connection
here is built with redis-py's retries off and the pool decides, block by
block, whether running the caller's block again is provably safe.

Duties:
1. Hand out connections (``with pool.conn(idempotent=...) as conn``) from a
   bounded LIFO pool; a checkout that starves is retried once.
2. Know when a failure happened: while dialing (nothing was sent), or after
   a command may have reached Redis. :class:`Conn` dials before it sends and
   counts completed round trips, so the pool can tell.
3. Decide with :func:`retry_plan`, a pure function: replay after a dial
   failure or on an idempotent block with backoff and jitter up to a cap;
   one immediate reconnect-and-retry on READONLY/NOREPLICAS/UNBLOCKED; never
   replay a non-idempotent block once one of its round trips completed.
4. Report every retry, refusal and give-up to the ``on_redis_error`` hook.
5. Forget every inherited socket in a forked child (``os.register_at_fork``).
6. Keep every wait inside ``pool.deadline`` while one is set (a drain):
   no dial, send or retry pause starts past it, and dial, read and checkout
   timeouts are clipped to the time left (:mod:`wurk.redis.limits`). A dial,
   TLS handshake included, is bounded by the connect timeout.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import queue
import random
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import redis
import redis.exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from wurk.core.logging import get_logger
from wurk.redis.limits import Deadline, DeadlinePassed, bounded_dial

if TYPE_CHECKING:
    from wurk.settings.config import Config

T = TypeVar("T")

# Replies that mean the server we reached is not (or no longer) the primary.
FAILOVER_PREFIXES = ("READONLY", "NOREPLICAS", "UNBLOCKED")
# What redis-py's Sentinel connections raise in place of a READONLY reply.
DEMOTED_MASTER = "The previous master is now a slave"


class ConnectError(rx.ConnectionError):
    """Raised while dialing or handshaking: no command of the block left us."""


class PoolExhausted(rx.ConnectionError):
    """No connection came free within the checkout timeout."""


class RedisErrorHook(Protocol):
    def __call__(self, error: BaseException, *, attempt: int, action: str) -> None: ...


class ErrorKind(enum.Enum):
    CONNECT = "connect"      # failed while dialing (or LOADING): provably unapplied
    IO = "io"                # failed after sending: outcome unknown
    FAILOVER = "failover"    # READONLY & co: the command was refused outright
    OTHER = "other"          # a real error reply or a bug: not ours to retry


class Plan(enum.Enum):
    FAILOVER = "failover"    # reconnect and retry at once
    BACKOFF = "backoff"      # reconnect after a pause and retry
    UNSAFE = "unsafe"        # may have applied: report and raise
    EXHAUSTED = "exhausted"  # replayable, but out of attempts: report and raise
    PROPAGATE = "propagate"  # not transient: raise untouched


def classify(error: BaseException) -> ErrorKind:
    if isinstance(error, rx.AuthenticationError | rx.AuthorizationError):
        return ErrorKind.OTHER
    if isinstance(error, ConnectError | DeadlinePassed | rx.BusyLoadingError):
        # LOADING (a restarted server still reading its data) refuses every
        # command it answers: as provably unapplied as a failed dial.
        return ErrorKind.CONNECT
    if isinstance(error, rx.ResponseError):
        failover = str(error).startswith(FAILOVER_PREFIXES) or isinstance(error, rx.ReadOnlyError)
        return ErrorKind.FAILOVER if failover else ErrorKind.OTHER
    if isinstance(error, rx.ConnectionError) and str(error) == DEMOTED_MASTER:
        return ErrorKind.FAILOVER
    if isinstance(error, rx.ConnectionError | rx.TimeoutError | OSError):
        return ErrorKind.IO
    return ErrorKind.OTHER


def retry_plan(kind: ErrorKind, attempt: int, max_attempts: int, *,
               idempotent: bool, dirty: bool) -> Plan:
    """What to do after attempt number ``attempt`` (1-based) failed.

    ``dirty`` means an earlier round trip of this block completed, so some
    of its commands certainly applied.
    """
    if kind is ErrorKind.OTHER:
        return Plan.PROPAGATE
    replayable = idempotent or (not dirty and kind in (ErrorKind.CONNECT, ErrorKind.FAILOVER))
    if not replayable:
        return Plan.UNSAFE
    if kind is ErrorKind.FAILOVER:
        return Plan.FAILOVER if attempt == 1 else Plan.EXHAUSTED
    return Plan.BACKOFF if attempt < max_attempts else Plan.EXHAUSTED


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential from ``base``, capped, with up to 50% jitter to de-sync a fleet."""
    delay: float = min(cap, base * (2 ** (attempt - 1)))
    return delay + rng.random() * delay * 0.5


def _load_peek() -> Callable[[int], bool] | None:
    """A check for "nothing to read, still open" on an idle socket: libc
    recv(fd, 1 byte, MSG_PEEK | MSG_DONTWAIT) through ctypes.PyDLL, which keeps
    the GIL. A Python socket call would release it, and on a busy worker each
    release can cost a wait of a whole switch interval."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        recv = ctypes.PyDLL(None, use_errno=True).recv
    except (OSError, AttributeError):
        return None
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    recv.restype = ctypes.c_ssize_t
    byte = ctypes.create_string_buffer(1)
    flags = socket.MSG_PEEK | socket.MSG_DONTWAIT
    would_block = {errno.EAGAIN, errno.EWOULDBLOCK}

    def quiet_and_open(fd: int) -> bool:
        return recv(fd, byte, 1, flags) < 0 and ctypes.get_errno() in would_block

    return quiet_and_open


_quiet_and_open = _load_peek()


def _server_closed(raw: Any) -> bool:
    """True when an idle socket must be re-dialed: EOF, an error, or bytes
    nobody asked for (a reply out of step)."""
    if _quiet_and_open is not None:
        try:
            return not _quiet_and_open(raw._sock.fileno())
        except OSError:
            return True
    try:
        return bool(raw.can_read(0))
    except (rx.ConnectionError, OSError):
        return True


class Conn:
    """One checked-out connection. Dials before sending and counts round trips."""

    def __init__(self, raw: Any, on_redial: Callable[[], None] | None = None,
                 deadline: Deadline | None = None) -> None:
        self.raw = raw
        self.round_trips = 0
        self.pid = os.getpid()
        self._on_redial = on_redial
        self._deadline = deadline or Deadline()

    def _dial(self) -> None:
        self._deadline.check()
        raw: Any = self.raw
        if raw._sock is not None:
            # A socket the server closed while it sat idle in the pool reads
            # as EOF; find out now, while re-dialing is still provably safe.
            if not _server_closed(raw):
                return
            raw.disconnect()
            # The server dropped us while idle: a restart, or a failover
            # (Sentinel kills the clients of the servers it reconfigures).
            if self._on_redial is not None:
                self._on_redial()
        connect_timeout = raw.socket_connect_timeout
        raw.socket_connect_timeout = self._deadline.clip(connect_timeout)
        try:
            raw.connect()
        except (rx.AuthenticationError, rx.AuthorizationError):
            raise
        except (rx.RedisError, OSError) as exc:
            raise ConnectError(f"cannot connect to Redis: {exc}") from exc
        finally:
            raw.socket_connect_timeout = connect_timeout

    def _read_timeout(self, timeout: float | None) -> float | None:
        """The read timeout for one reply: as asked, clipped to the pool's deadline."""
        if self._deadline.at is None:
            return timeout
        return self._deadline.clip(timeout or self.raw.socket_timeout)

    def call(self, *args: Any, timeout: float | None = None) -> Any:
        """Send one command and return its reply (bytes, ints, lists)."""
        self._dial()
        timeout = self._read_timeout(timeout)
        self.raw.send_command(*args, check_health=False)
        try:
            reply = self.raw.read_response(timeout=timeout) if timeout else self.raw.read_response()
        except rx.ResponseError as exc:
            # A READONLY-style refusal applied nothing: it leaves the block clean.
            if classify(exc) is not ErrorKind.FAILOVER:
                self.round_trips += 1
            raise
        self.round_trips += 1
        return reply

    def pipeline(self, commands: Sequence[Sequence[Any]], *, transaction: bool = False,
                 raise_on_error: bool = True, timeout: float | None = None) -> list[Any]:
        """Send many commands in one write and read every reply: one round trip.

        With ``transaction`` they are wrapped in MULTI/EXEC and the EXEC reply
        is returned. Error replies are returned in place (or the first is
        raised after every reply has been read, keeping the stream in step).
        ``timeout`` replaces the read timeout for each reply (a WAIT inside).
        """
        if not commands:
            return []
        self._dial()
        timeout = self._read_timeout(timeout)
        wire = [("MULTI",), *commands, ("EXEC",)] if transaction else list(commands)
        self.raw.send_packed_command(self.raw.pack_commands(wire), check_health=False)
        replies: list[Any] = []
        for _ in wire:
            try:
                replies.append(self.raw.read_response(timeout=timeout) if timeout
                               else self.raw.read_response())
            except rx.ResponseError as exc:
                replies.append(exc)
        # As in call(): a batch the server refused outright (READONLY & co, or
        # a transaction whose EXEC never ran) applied nothing and leaves the block clean.
        if not _applied_nothing(replies, transaction):
            self.round_trips += 1
        if transaction:
            # A replica answers each queued write with READONLY and then EXEC
            # with EXECABORT; surface the READONLY so failover handling sees it.
            queued_errors = [r for r in replies[1:-1] if isinstance(r, rx.ResponseError)]
            if queued_errors and not isinstance(replies[-1], list):
                raise queued_errors[0]
            replies = replies[-1] if isinstance(replies[-1], list) else [replies[-1]]
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, rx.ResponseError):
                    raise reply
        return replies

    def close(self) -> None:
        self.raw.disconnect()


def _applied_nothing(replies: list[Any], transaction: bool) -> bool:
    if transaction:
        return not isinstance(replies[-1], list)
    return all(isinstance(r, rx.ResponseError) and classify(r) is ErrorKind.FAILOVER
               for r in replies)


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


@dataclass(frozen=True)
class SentinelSettings:
    """Where Sentinel runs and which master to follow; the URL still gives db and auth."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Config) -> SentinelSettings | None:
        if not config.sentinels:
            return None
        pairs = []
        for address in config.sentinels:
            host, _, port = address.rpartition(":")
            pairs.append((host, int(port)))
        return cls(tuple(pairs), str(config.sentinel_master), config.sentinel_password)

    def pool_template(self, kwargs: dict[str, Any],
                      connect_timeout: float) -> redis.ConnectionPool:
        """A pool whose connections ask the sentinels for the master on every dial,
        so a reconnect after a failover reaches the promoted replica."""
        own = {k: v for k, v in kwargs.items() if k not in ("host", "port", "connection_class")}
        manager = Sentinel(list(self.sentinels), sentinel_kwargs={  # type: ignore[no-untyped-call]
            "socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout,
            "password": self.password, "retry": Retry(NoBackoff(), 0)})
        return SentinelConnectionPool(self.master, manager, **own)  # type: ignore[no-untyped-call]


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
        return cls(
            config.redis_url, size=config.pool_size,
            connect_timeout=config.redis_connect_timeout,
            read_timeout=config.redis_read_timeout,
            retry=RetrySettings(config.redis_retry_attempts, config.redis_retry_base,
                                config.redis_retry_cap),
            on_error=config.on_redis_error,
            sentinel=SentinelSettings.from_config(config),
        )

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
                delay = self._replay_delay(exc, plan, attempt)
                if delay is None:
                    raise
                if delay:
                    self._sleep(delay)

    def _replay_delay(self, exc: Exception, plan: Plan, attempt: int) -> float | None:
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


def _reset_pools_after_fork() -> None:
    for pool in list(_live_pools):
        pool.after_fork_in_child()


os.register_at_fork(after_in_child=_reset_pools_after_fork)

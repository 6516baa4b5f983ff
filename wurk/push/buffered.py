"""Reliable push: pushes made while Redis is unreachable wait in memory.

Duties:
1. Send a push at once when nothing is waiting. If it fails while dialing
   (nothing reached Redis), keep it in a bounded, ordered buffer instead of
   raising; once anything waits, later pushes queue behind it so order holds.
2. A full buffer is an error the caller sees (:class:`PushBufferFullError`),
   never a silent drop.
3. A drainer thread (under :mod:`wurk.core.threads`; no error ends it) sends
   the buffer, oldest first, when Redis returns. A
   push whose outcome is unknown (the connection broke after sending) may
   have landed, so it is never sent again: it is reported and dropped.
   A replayable push (replica-confirmed, see wurk.push.confirmed) is the
   exception: it is kept and sent again until replicas confirm it, for at
   most half its markers' lifetime after it may first have landed.
4. At process exit, try one last flush within ``push_flush_timeout``; then
   stop the drainer (letting a send in flight finish) and write what is
   left to the spool (:mod:`wurk.push.spool`), fsynced, logged at ERROR with the
   count and the file; only if that fails too are the jids logged as lost.
   The first push a process keeps for a Redis that never answered also
   warns (:mod:`wurk.push.nowhere`), naming the file it will go to.
5. A forked child starts with an empty buffer, no drainer and fresh locks:
   the parent still owns and sends what it buffered.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.push.confirmed import ConfirmedPush, PushNotConfirmedError
from wurk.push.nowhere import Notice
from wurk.push.spool import Destination, SpoolEntry, write_spool
from wurk.redis.policy import ErrorKind, PoolExhausted, classify, trouble_backoff
from wurk.redis.pool import RedisPool
from wurk.settings.config import Config
from wurk.settings.hooks import RedisErrorHook
from wurk.wire import keys

log = get_logger("wurk.push")
# Between sends of a kept push while Redis stays away: 0.1 s doubling to 2 s,
# jittered as any retry through Redis trouble (a fleet of clients lost it together).
DRAIN_BACKOFF = trouble_backoff(0.1, 2.0)


class PushBufferFullError(RuntimeError):
    """Redis is unreachable and the push buffer is full: this push was not taken."""


# A replayable push is given up (and reported) before its markers expire.
REPLAY_LIMIT = keys.PUSHED_TTL / 2


@dataclass
class PendingPush:
    # Sends the push; the argument caps the pool's attempts.
    send: Callable[[int], object]
    jids: tuple[str, ...]
    # True when sending it again after an unknown outcome cannot enqueue twice.
    replayable: bool = False
    # When a send first failed in a way that may have written it; a push
    # that never reached Redis is kept for as long as it takes.
    maybe_landed: float | None = None
    # The jobs and the nonce to spool it with at exit; None: cannot be spooled.
    content: ConfirmedPush | None = None

    def worth_keeping(self, exc: BaseException) -> bool:
        """Whether a failed send may be tried again later (and note when it may have landed)."""
        if unapplied(exc):
            return True
        if self.maybe_landed is None:
            self.maybe_landed = time.monotonic()
        if not self.replayable:
            return False
        # Past the limit its markers may be gone, so a resend could double it.
        if time.monotonic() - self.maybe_landed >= REPLAY_LIMIT:
            return False
        return isinstance(exc, PushNotConfirmedError) or classify(exc) is ErrorKind.IO


def send_timeout(config: Config) -> float:
    """How long one send of a buffered push can take: a dial, a reply, and the
    replicas' confirmation (at exit, a send in flight is waited for that long)."""
    return config.redis_connect_timeout + config.redis_read_timeout + config.push_replicas_timeout


def unapplied(exc: BaseException) -> bool:
    """True when the failure proves nothing was applied: the dial failed, or
    the server refused the command outright (READONLY, NOREPLICAS during a
    failover)."""
    return isinstance(exc, PoolExhausted) or classify(exc) in (ErrorKind.CONNECT,
                                                               ErrorKind.FAILOVER)


class Backlog:
    """The pushes waiting in a buffer, oldest first, and how many jobs they hold.
    Shared by the sync buffer (under its lock) and the asyncio one."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pushes: collections.deque[PendingPush] = collections.deque()
        self._jobs = 0

    def __len__(self) -> int:
        return self._jobs

    def __bool__(self) -> bool:
        return bool(self._pushes)

    @property
    def head(self) -> PendingPush:
        return self._pushes[0]

    def add(self, push: PendingPush) -> None:
        """Queue ``push`` behind the rest, or raise :class:`PushBufferFullError`."""
        if self._jobs + len(push.jids) > self.capacity:
            raise PushBufferFullError(
                f"Redis is unreachable and {self._jobs} jobs already wait to be pushed "
                f"(push_buffer_size={self.capacity}); this push was not taken")
        self._pushes.append(push)
        self._jobs += len(push.jids)

    def note_kept(self, push: PendingPush, exc: BaseException) -> None:
        log.warning("push.buffered", jids=list(push.jids), waiting=self._jobs,
                    error=f"{type(exc).__name__}: {exc}")

    def done(self, push: PendingPush) -> None:
        """Retire ``push`` if it still heads the queue (the exit path may have taken it)."""
        if self._pushes and self._pushes[0] is push:
            self._pushes.popleft()
            self._jobs -= len(push.jids)

    def take_all(self) -> list[PendingPush]:
        left = list(self._pushes)
        self._pushes.clear()
        self._jobs = 0
        return left


def still_sending(push: PendingPush) -> None:
    log.warning("push.still_sending", jids=list(push.jids),
                hint="spooled too; its nonce makes a resend of a "
                     "confirmed push a no-op, a plain one may land twice")


class PushBuffer:
    def __init__(self, pool: RedisPool, capacity: int, flush_timeout: float, *,
                 spool: Destination | None = None, send_timeout: float = 5.0,
                 notice: Notice | None = None) -> None:
        self.pool = pool
        self.capacity = capacity
        self.flush_timeout = flush_timeout
        self.spool = spool
        self.notice = notice
        # How long one send can take: at exit, a send in flight is waited for.
        self.send_timeout = send_timeout
        # The process that owns what it buffers: set here, not at import, or
        # a buffer made in a forked child would think it the parent's.
        self._pid = os.getpid()
        self._reset()
        _live_buffers.add(self)

    def _reset(self) -> None:
        self._backlog = Backlog(self.capacity)
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._drainer: threading.Thread | None = None
        # Set at exit: the drainer stops, what is left goes to the spool.
        self._closed = False
        self._sending = False
        # The spool file a PushSpooledWarning named, once one did.
        self._spool_name: str | None = None

    def __len__(self) -> int:
        return len(self._backlog)

    def send(self, push: PendingPush) -> None:
        with self._lock:
            if self._backlog:
                self._keep(push)
                return
        try:
            push.send(1)
        except Exception as exc:
            # Once the exit path spooled the buffer, nothing would send a kept push.
            if self._closed or not push.worth_keeping(exc):
                raise
            self._spool_name = noticed(self.notice, push) or self._spool_name
            with self._lock:
                self._keep(push)
            self._backlog.note_kept(push, exc)

    def _keep(self, push: PendingPush) -> None:
        """Caller holds the lock."""
        self._backlog.add(push)
        if self._drainer is None or not self._drainer.is_alive():
            self._drainer = threads.start("push-drainer", self._drain)

    def _drain(self) -> None:
        backoff = DRAIN_BACKOFF
        while (push := self._next()) is not None:
            try:
                push.send(1)
            except BaseException as exc:  # noqa: BLE001 - the drainer outlives any one failure
                if push.worth_keeping(exc):
                    self._settle(push, done=False)
                    backoff = backoff.increment()
                    time.sleep(backoff.pause())
                    continue
                self._report_dropped(push, exc)
            backoff = backoff.reset()
            self._settle(push, done=True)

    def _next(self) -> PendingPush | None:
        with self._lock:
            if not self._backlog or self._closed:
                self._drained.notify_all()
                return None
            self._sending = True
            return self._backlog.head

    def _settle(self, push: PendingPush, *, done: bool) -> None:
        with self._lock:
            self._sending = False
            # The exit path may have spooled it (and emptied the deque) meanwhile.
            if done:
                self._backlog.done(push)
            self._drained.notify_all()

    def _report_dropped(self, push: PendingPush, exc: BaseException) -> None:
        report_dropped(push, exc, self.pool.on_error)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything buffered was sent; False if time ran out."""
        # A drain's deadline on the pool (a process exiting) shortens the wait.
        wait = self.pool.deadline.clip(self.flush_timeout if timeout is None else timeout)
        deadline = time.monotonic() + (wait or 0.0)
        with self._lock:
            while self._backlog:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._drained.wait(min(remaining, 0.1))
        return True

    def flush_at_exit(self) -> None:
        if self._pid != os.getpid() or not self._backlog:
            return
        if not self.flush():
            self._spool(self._close())

    def _close(self) -> list[PendingPush]:
        """Stop the drainer, wait out a send in flight, and take what is left."""
        deadline = time.monotonic() + (self.pool.deadline.clip(self.send_timeout) or 0.0)
        with self._lock:
            self._closed = True
            while self._sending and time.monotonic() < deadline:
                self._drained.wait(0.05)
            if self._sending:
                still_sending(self._backlog.head)
            return self._backlog.take_all()

    def _spool(self, left: list[PendingPush]) -> None:
        spool_left(self.spool, left, self._spool_name)

    def after_fork_in_child(self) -> None:
        self._reset()
        self._pid = os.getpid()


def report_dropped(push: PendingPush, exc: BaseException, on_error: RedisErrorHook) -> None:
    """Log a push given up: unconfirmed too long, or one that may have landed."""
    if isinstance(exc, PushNotConfirmedError):
        log.error("push.unconfirmed", jids=list(push.jids), error=str(exc),
                  hint=f"no replica confirmed it for {REPLAY_LIMIT:g}s; it stays "
                       "on the primary, unguarded against a failover")
        return
    log.error("push.outcome_unknown", jids=list(push.jids),
              error=f"{type(exc).__name__}: {exc}",
              hint="it may have landed, so it is not sent again")
    on_error(exc, attempt=1, action="unsafe")


def noticed(notice: Notice | None, push: PendingPush) -> str | None:
    """Before a buffer keeps ``push``: the spool file name a warning gave (it may
    raise, as an error: the push is then not kept)."""
    return notice.before_keeping(push.jids) if notice is not None else None


def spool_left(spool: Destination | None, left: list[PendingPush],
               name: str | None = None) -> None:
    """Write what is left at exit to the spool, fsynced (as ``name``, when a
    warning named the file); log what could not be."""
    spoolable = [push for push in left if push.content is not None]
    jids = [jid for push in spoolable for jid in push.jids]
    lost = [jid for push in left if push.content is None for jid in push.jids]
    if spool is not None and spoolable:
        try:
            path = write_spool(spool.directory, spool.target, spool_entries(spoolable), name)
            log.error("push.spooled", jobs=len(jids), path=str(path), jids=jids,
                      hint="Redis stayed unreachable until exit; a wurk process "
                           "with this spool_dir pushes them, or `wurk spool push`")
            jids = []
        except OSError as exc:
            log.error("push.spool_failed", path=str(spool.directory),
                      error=f"{type(exc).__name__}: {exc}")
    if jids or lost:
        log.error("push.unflushed", jobs=len(jids) + len(lost), jids=jids + lost,
                  hint="Redis stayed unreachable until the process exited; "
                       "these jobs are lost")


def spool_entries(pushes: list[PendingPush]) -> list[SpoolEntry]:
    return [SpoolEntry(push.content.nonce, job.jid, job.queue, job.run_at, job.raw)
            for push in pushes if push.content is not None for job in push.content.jobs]


_live_buffers: weakref.WeakSet[PushBuffer] = weakref.WeakSet()


def forget_after_fork() -> None:
    """In a forked child: every buffer forgets the parent's pushes and threads."""
    for buffer in list(_live_buffers):
        buffer.after_fork_in_child()


def flush_push_buffers() -> None:
    """Try to send every buffer's pushes (within each one's flush timeout); spool the rest.

    Runs at interpreter exit; a process that leaves with ``os._exit`` (a
    swarm child) calls it itself.
    """
    for buffer in list(_live_buffers):
        buffer.flush_at_exit()

atexit.register(flush_push_buffers)

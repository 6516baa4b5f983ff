"""Replica-confirmed pushes: with ``push_replicas = N`` a push counts once N
replicas hold it.

Redis replicates asynchronously. A push the primary took a moment before a
failover can be missing from the promoted replica, and the client was
already told it succeeded. Here each push is written by the PUSH_ONCE script,
which stores a per-jid marker holding the push's nonce together with the
job, and then WAITs for N replicas on the same connection. When fewer
confirm, the push is sent again later with the same nonce: wherever the
first write survived, the marker turns the resend into a no-op, and where it
was lost the job goes in fresh. The push is neither lost nor enqueued twice.

Duties:
1. Write a push (one job or a batch, immediate or scheduled) once, then WAIT
   (``flow``: each client drives it on its own pool; ``write`` on the sync one).
2. Raise :class:`PushNotConfirmedError` when too few replicas confirm.
3. Retire the markers of confirmed pushes on a later write; their TTL
   (``keys.PUSHED_TTL``) retires the rest (all of them for the spool
   drainer's writer, which must be able to replay a file after a crash).
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import redis.exceptions as rx

from wurk.push.exchange import Flow, Send, Talk, drive
from wurk.wire import keys
from wurk.wire.lua import PUSH_ONCE
from wurk.wire.payload import score

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool

# Enough markers retired per write to keep up with any push rate, few enough
# to keep the script call small.
RETIRE_BATCH = 1000
# A client that stops pushing leaves the rest to the markers' TTL.
RETIRE_BACKLOG = 100_000


class PushNotConfirmedError(RuntimeError):
    """The primary took the push but too few replicas confirmed it in time.

    :meth:`retry` sends the same push again: wherever it already landed it
    is not enqueued a second time. Pushing the same item anew would be a new
    push, and could enqueue a second copy.
    """

    def __init__(self, push: ConfirmedPush, confirmed: int, wanted: int, timeout: float,
                 resend: Callable[[], object]) -> None:
        self.jids = push.jids
        self.confirmed = confirmed
        self.wanted = wanted
        self._resend = resend
        super().__init__(
            f"{len(self.jids)} job(s) written to the Redis primary but only {confirmed} of "
            f"{wanted} replicas confirmed within {timeout:g}s (push_replicas): they may be "
            f"lost if the primary fails now; error.retry() sends them again without "
            f"doubling (first jid: {self.jids[0] if self.jids else '-'})")

    def retry(self) -> Any:
        """Send the same push again; raises this error anew if still unconfirmed.

        For a push made by :class:`wurk.AsyncClient` it returns an awaitable:
        ``await error.retry()``."""
        return self._resend()


class QueuedJob(NamedTuple):
    """One serialised job on its way in: ``run_at`` None means now.

    A named tuple: a bulk push makes a thousand at a time, and a frozen
    dataclass costs several times as much to build."""

    jid: str
    queue: str
    raw: str
    run_at: float | None


@dataclass(frozen=True)
class ConfirmedPush:
    """One logical push: its jobs and the nonce that every resend of it shares."""

    jobs: tuple[QueuedJob, ...]
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def jids(self) -> tuple[str, ...]:
        return tuple(job.jid for job in self.jobs)


class ConfirmedWriter:
    def __init__(self, replicas: int, timeout: float, read_timeout: float, *,
                 retire: bool = True) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self._read_timeout = read_timeout
        # False leaves every marker to its TTL (the spool drainer: a crash
        # before its file is deleted must find them, to replay as a no-op).
        self._retires = retire
        self._lock = threading.Lock()
        # (jid, nonce) of confirmed pushes whose markers can go.
        self._retire: list[tuple[str, str]] = []
        _live_writers.add(self)

    def flow(self, push: ConfirmedPush, resend: Callable[[ConfirmedPush], object], *,
             attempts: int | None = None) -> Flow[int]:
        """Send ``push`` and wait for the replicas; returns how many jobs went in
        now (the rest had landed on an earlier attempt). A
        :class:`PushNotConfirmedError` it raises retries with ``resend(push)``."""
        retire = self._take_retire()
        trip = _PushAndWait(self._wire(push, retire), self.timeout + self._read_timeout,
                            attempts)
        try:
            pushed, confirmed = yield trip
        except BaseException:
            self._give_back_retire(retire)
            raise
        return self._settle(push, pushed, confirmed, lambda: resend(push))

    def write(self, pool: RedisPool, push: ConfirmedPush, *,
              attempts: int | None = None) -> int:
        """:meth:`flow` on the sync pool (the spool drainer's write)."""
        return drive(pool, self.flow(push, lambda again: self.write(pool, again),
                                     attempts=attempts))

    def _wire(self, push: ConfirmedPush, retire: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
        """The PUSH_ONCE call for ``push`` (retiring ``retire``'s markers), then WAIT."""
        keys_ = [keys.QUEUES, *(keys.pushed(jid) for jid, _ in retire)]
        args: list[Any] = [keys.PUSHED_TTL, len(retire), push.nonce,
                           *(nonce for _, nonce in retire)]
        for job in push.jobs:
            if job.run_at is None:
                keys_ += [keys.pushed(job.jid), keys.queue(job.queue)]
                args += [job.queue, "", job.raw]
            else:
                keys_ += [keys.pushed(job.jid), keys.SCHEDULE]
                args += [job.queue, score(job.run_at), job.raw]
        wait_ms = max(1, round(self.timeout * 1000))
        return [("EVALSHA", PUSH_ONCE.sha, len(keys_), *keys_, *args),
                ("WAIT", self.replicas, wait_ms)]

    def _settle(self, push: ConfirmedPush, pushed: int, confirmed: int,
                resend: Callable[[], object]) -> int:
        if confirmed < self.replicas:
            # The retired markers were handled (the script ran); this push's
            # markers must live on, to guard its resend.
            raise PushNotConfirmedError(push, confirmed, self.replicas, self.timeout, resend)
        if self._retires:
            with self._lock:
                self._retire.extend((jid, push.nonce) for jid in push.jids)
                del self._retire[:-RETIRE_BACKLOG]
        return pushed

    def _take_retire(self) -> list[tuple[str, str]]:
        with self._lock:
            taken, self._retire = self._retire[:RETIRE_BATCH], self._retire[RETIRE_BATCH:]
        return taken

    def _give_back_retire(self, retire: list[tuple[str, str]]) -> None:
        with self._lock:
            self._retire[:0] = retire

    def after_fork_in_child(self) -> None:
        # The parent retires its own markers; a child starts with none to retire.
        self._lock = threading.Lock()
        self._retire = []


@dataclass(frozen=True)
class _PushAndWait:
    """One round trip: the script, then WAIT on the same connection. Safe to
    replay: the markers make a second write a no-op."""

    wire: list[tuple[Any, ...]]
    read_timeout: float
    attempts: int | None
    idempotent: bool = True

    def talk(self, conn: object) -> Talk[tuple[int, int]]:
        replies = yield Send(self.wire, timeout=self.read_timeout)
        if isinstance(replies[0], rx.NoScriptError):
            # A restarted or flushed server: nothing ran, load and go again.
            replies = (yield Send([("SCRIPT", "LOAD", PUSH_ONCE.source), *self.wire],
                                  timeout=self.read_timeout))[1:]
        return _counts(replies)


def _counts(replies: list[Any]) -> tuple[int, int]:
    """The script's count of jobs pushed and WAIT's count of replicas; an error reply raised."""
    for reply in replies:
        if isinstance(reply, rx.ResponseError):
            raise reply
    return int(replies[0]), int(replies[1])


_live_writers: weakref.WeakSet[ConfirmedWriter] = weakref.WeakSet()


def forget_after_fork() -> None:
    """In a forked child: no markers of the parent's to retire."""
    for writer in list(_live_writers):
        writer.after_fork_in_child()


"""Replica-confirmed pushes: with ``push_replicas = N`` a push counts once N
replicas hold it.

Redis replicates asynchronously. A push the primary took a moment before a
failover can be missing from the promoted replica, and the client was
already told it succeeded. Here each push is written by the PUSH_ONCE script,
which stores a per-jid marker together with the job, and then WAITs for N
replicas on the same connection. When fewer confirm, the push is sent again
later: wherever the first write survived, the marker turns the resend into
a no-op, and where it was lost the job goes in fresh. The push is neither
lost nor enqueued twice.

Duties:
1. Write a batch of jobs (immediate or scheduled) once per jid, then WAIT.
2. Raise :class:`PushNotConfirmedError` when too few replicas confirm.
3. Retire the markers of confirmed pushes on a later write; their TTL
   (``keys.PUSHED_TTL``) retires the rest.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk import keys
from wurk.lua import PUSH_ONCE
from wurk.payload import score

if TYPE_CHECKING:
    from wurk.redis_pool import Conn, RedisPool

# Enough markers retired per write to keep up with any push rate, few enough
# to keep the script call small.
RETIRE_BATCH = 1000
# A client that stops pushing leaves the rest to the markers' TTL.
RETIRE_BACKLOG = 100_000


class PushNotConfirmedError(RuntimeError):
    """The primary took the push but too few replicas confirmed it in time.

    Pushing the same jids again within ``keys.PUSHED_TTL`` seconds is safe:
    a job already in Redis is not enqueued a second time.
    """

    def __init__(self, jids: Sequence[str], confirmed: int, wanted: int,
                 timeout: float) -> None:
        self.jids = tuple(jids)
        self.confirmed = confirmed
        self.wanted = wanted
        super().__init__(
            f"{len(self.jids)} job(s) written to the Redis primary but only {confirmed} of "
            f"{wanted} replicas confirmed within {timeout:g}s (push_replicas): they may be "
            f"lost if the primary fails now; pushing the same jids again is safe "
            f"(first: {self.jids[0] if self.jids else '-'})")


@dataclass(frozen=True)
class QueuedJob:
    """One serialised job on its way in: ``run_at`` None means now."""

    jid: str
    queue: str
    raw: str
    run_at: float | None


class ConfirmedWriter:
    def __init__(self, replicas: int, timeout: float, read_timeout: float) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._retire: list[str] = []
        _live_writers.add(self)

    def write(self, pool: RedisPool, jobs: Sequence[QueuedJob], *,
              attempts: int | None = None) -> int:
        """Push ``jobs`` once each and wait for the replicas; returns how many
        went in now (the rest were already there from an earlier attempt)."""
        retire = self._take_retire()
        keys_ = [keys.QUEUES, *(keys.pushed(jid) for jid in retire)]
        args: list[Any] = [keys.PUSHED_TTL, len(retire)]
        for job in jobs:
            if job.run_at is None:
                keys_ += [keys.pushed(job.jid), keys.queue(job.queue)]
                args += [job.queue, "", job.raw]
            else:
                keys_ += [keys.pushed(job.jid), keys.SCHEDULE]
                args += [job.queue, score(job.run_at), job.raw]
        wait_ms = max(1, round(self.timeout * 1000))

        def push_and_wait(conn: Conn) -> tuple[int, int]:
            pushed = PUSH_ONCE.run(conn, keys_, args)
            confirmed = conn.call("WAIT", self.replicas, wait_ms,
                                  timeout=self.timeout + self._read_timeout)
            return int(pushed), int(confirmed)

        try:
            # Safe to replay: the markers make a second write a no-op.
            pushed, confirmed = pool.run(push_and_wait, idempotent=True, attempts=attempts)
        except BaseException:
            self._give_back_retire(retire)
            raise
        jids = [job.jid for job in jobs]
        if confirmed < self.replicas:
            # The retired markers were deleted (the script ran); only this
            # batch's markers must live on, to guard its resend.
            raise PushNotConfirmedError(jids, confirmed, self.replicas, self.timeout)
        with self._lock:
            self._retire.extend(jids)
            del self._retire[:-RETIRE_BACKLOG]
        return pushed

    def _take_retire(self) -> list[str]:
        with self._lock:
            taken, self._retire = self._retire[:RETIRE_BATCH], self._retire[RETIRE_BATCH:]
        return taken

    def _give_back_retire(self, retire: list[str]) -> None:
        with self._lock:
            self._retire[:0] = retire

    def after_fork_in_child(self) -> None:
        # The parent retires its own markers; a child starts with none to retire.
        self._lock = threading.Lock()
        self._retire = []


_live_writers: weakref.WeakSet[ConfirmedWriter] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for writer in list(_live_writers):
        writer.after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)

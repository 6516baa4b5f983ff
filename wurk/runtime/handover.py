"""The hand-over of claimed jobs from the fetcher thread to processor threads.

Reliable fetch claims exactly one job per processor thread that waits with
none on its way. This module keeps the two counts that make that exact, and
the queue the jobs travel through.

Duties:
1. Count the threads waiting in ``take`` and the jobs put but not yet taken.
   A thread counts in both until it has its job, so ``shortfall`` is exactly
   the number of threads still to claim for.
2. Move jobs through a SimpleQueue, whose blocking get is a C lock: far
   cheaper per job than a Python Condition.
3. On quiet or stop, wake every waiting thread with None and hand back what
   no thread took. Each waiter consumes at most one None, so every waiter
   counted gets one.

Correctness never rests on the wait's timeout. On CPython 3.11 a timed
``SimpleQueue.get`` whose wake-up item another taker took first, and which
resumes past its deadline, waits on with no timeout until the next put: a
waiter that lost its None would then sleep until the next job, however
short the fetch timeout.

It shares the fetch's lock: the counts change together with the fetch's own
bookkeeping, and the fetcher reads them while holding it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from wurk.runtime.work import UnitOfWork


class HandOver:
    def __init__(self, lock: threading.Lock, wake: threading.Condition, timeout: float,
                 closed: Callable[[], bool]) -> None:
        self._lock = lock
        self._wake = wake
        self._timeout = timeout
        # True once the fetch is quiet or stopping: no thread starts waiting then.
        self._closed = closed
        self._ready: queue.SimpleQueue[UnitOfWork | None] = queue.SimpleQueue()
        self.waiting = 0
        self.pending = 0

    def shortfall(self) -> int:
        """Threads waiting with no job on its way (caller holds the lock)."""
        return self.waiting - self.pending

    def put(self, work: UnitOfWork) -> None:
        """Send one claimed job to the threads (caller holds the lock)."""
        self.pending += 1
        self._ready.put(work)

    def take(self) -> UnitOfWork | None:
        """A processor's next job, waiting up to the fetch timeout; None when
        the fetch is closed (checked under the lock) or nothing came."""
        works = self.take_many(1)
        return works[0] if works else None

    def take_many(self, most: int) -> list[UnitOfWork]:
        """Up to ``most`` jobs for one taker that stands for ``most`` waiting
        threads (a processor thread takes one; the asyncio executor's feeder
        takes every free place's): what is ready at once, else
        what one claim brings, waiting up to the fetch timeout for its first
        job. Empty when the fetch is closed or nothing came. A stop's wake-up
        (None) ends the taking."""
        with self._lock:
            taken = self._take_ready(most)
            if taken or self._closed():
                return taken
            self.waiting += most
            self._wake.notify()
        first: UnitOfWork | None = None
        woken = False
        try:
            first = self._ready.get(timeout=self._timeout)
            woken = first is None
        except queue.Empty:
            pass
        finally:
            with self._lock:
                # Both at once: the fetcher must never see this taker gone
                # while its jobs still count as on their way, or the reverse.
                self.waiting -= most
                if first is not None:
                    self.pending -= 1
                # The fetcher puts a claim's jobs under this lock: all of them
                # are here. A taker woken by its None takes nothing more: the
                # next None in the queue is another waiter's.
                taken = [first] if first is not None else []
                if not woken:
                    taken += self._take_ready(most - len(taken))
        return taken

    def _take_ready(self, most: int) -> list[UnitOfWork]:
        """At most ``most`` jobs already in the queue (caller holds the lock)."""
        taken: list[UnitOfWork] = []
        while len(taken) < most:
            try:
                work = self._ready.get_nowait()
            except queue.Empty:
                break
            if work is None:
                break  # this taker's wake-up: the fetch is closing
            taken.append(work)
        self.pending -= len(taken)
        return taken

    def release_waiters(self) -> None:
        """Wake every thread blocked in ``take`` (quiet or stop): each gets None.

        The caller holds the lock, so the count is the waiters' own: a taker
        leaving meanwhile cannot make it short."""
        for _ in range(self.waiting):
            self._ready.put(None)

    def take_all(self) -> list[UnitOfWork]:
        """Empty the queue of claimed-but-unstarted jobs (caller holds the lock).

        Wake-ups not yet taken stay: their waiters still need them."""
        taken: list[UnitOfWork] = []
        wake_ups = 0
        while True:
            try:
                work = self._ready.get_nowait()
            except queue.Empty:
                break
            if work is None:
                wake_ups += 1
            else:
                taken.append(work)
        for _ in range(wake_ups):
            self._ready.put(None)
        self.pending -= len(taken)
        return taken

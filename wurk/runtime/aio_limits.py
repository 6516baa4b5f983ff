"""Soft and hard time limits for a job running as a task of the asyncio executor.

A task is not a thread: no async exception is ever raised for it
(``PyThreadState_SetAsyncExc`` is for the threads executor's job timer).

Duties:
1. Soft limit (``timeout``): at the deadline the job's task is cancelled
   (``CancelledError`` inside the job at its next ``await``) and the run
   fails with :class:`~wurk.runtime.time_limits.JobTimeout`, retried as
   usual; once a limit fired, the run fails with it even if the job swallowed
   the cancellation and returned (as in the threads executor).
2. Hard limit (``hard_timeout``): a thread of its own (:class:`HardWatch`,
   not the loop, which a coroutine stuck in sync code holds) runs the job
   timer's own hard-limit step at the deadline (``JobTimer._overran``: it
   takes the job from the in-flight table, settles it as a JobTimeout
   failure through the atomic settle, and asks the process to recycle), and
   has the task cancelled. A swarm parent is told the hard deadline at start
   and the end of the run, as for a thread (it KILLs a child too wedged to
   get there itself).
3. The end of a run and a firing limit are decided under one lock: a run
   that ended is never settled as overrun, and the outcome of one that
   overran is dropped. The loop's soft-limit handle goes when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.runtime.job_timer import JobTimer, Run
from wurk.runtime.time_limits import JobTimeout, Limits
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.job_timer")


def make_run(slot: str, work: UnitOfWork, jid: str | None, options: JobOptions | None,
             limits: Limits) -> Run:
    """The timer's record of one bounded run; tid 0: there is no thread to raise in."""
    return Run(0, slot, work, jid, options, limits)


async def bounded(watch: HardWatch, run: Run, step: Awaitable[Any]) -> Any:
    """Await ``step`` (the job's chain, in this task) under ``run.limits``."""
    limits = run.limits
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a job's time limits need the job's own task")
    loop = asyncio.get_running_loop()
    fired: list[JobTimeout] = []
    soft = (None if limits.timeout is None
            else loop.call_later(limits.timeout, _soft, task, run, fired))
    if limits.hard_timeout is not None:
        watch.arm(run, task, loop, fired)
    try:
        value = await step
    except asyncio.CancelledError:
        if not fired:
            raise  # a stop, or the job's own doing
        task.uncancel()
        raise fired[0] from None
    finally:
        if limits.hard_timeout is not None:
            watch.end(run)
        run.done = True
        if soft is not None:
            soft.cancel()
    if fired:
        task.uncancel()
        raise fired[0]
    return value


def _soft(task: asyncio.Task[Any], run: Run, fired: list[JobTimeout]) -> None:
    if task.done() or run.done or fired:
        return
    seconds = run.limits.timeout or 0.0
    fired.append(JobTimeout(f"job ran past its timeout of {seconds:g}s", seconds=seconds,
                            hard=False))
    log.warning("job.timeout", jid=run.jid, queue=run.work.queue, timeout=seconds)
    task.cancel()


_Armed = tuple[float, int, Run, "asyncio.Task[Any]", asyncio.AbstractEventLoop, list[JobTimeout]]


class HardWatch:
    """Hard limits of a process's tasks, kept by a thread of their own (started with
    the first hard-limited job), so a coroutine stuck in sync code, which holds
    the loop, is still settled on time and the process still recycles."""

    def __init__(self, timer: JobTimer) -> None:
        self.timer = timer
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[_Armed] = []
        self._seq = itertools.count()
        self._active = 0
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, run: Run, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop,
            fired: list[JobTimeout]) -> None:
        when = run.started + (run.limits.hard_timeout or 0.0)
        with self._cond:
            # Ended runs stay until their deadline: rebuilt once they outnumber live ones.
            if len(self._heap) > 64 and len(self._heap) > 8 * self._active:
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (when, next(self._seq), run, task, loop, fired))
            self._active += 1
            self._cond.notify()
            if self._thread is None:
                self._thread = threads.start("aio-hard-limits", self._loop,
                                             stopped=lambda: self._stopped,
                                             name="wurk-aio-hard-limits")
        self.timer._note_start(run)  # the timer's own note to a swarm parent, for a task

    def end(self, run: Run) -> None:
        """The run is over: from now on its hard limit cannot fire."""
        with self._lock:
            if run.done:
                return
            run.done = True
            self._active -= 1
        if run.reported:
            self.timer._note(b"-" + dumps([run.jid]).encode() + b"\n")

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        while not self._stopped:
            due = self._next_due()
            if due is not None:
                self._overran(*due)

    def _next_due(self) -> tuple[Run, asyncio.Task[Any], asyncio.AbstractEventLoop] | None:
        with self._cond:
            if not self._heap:
                self._cond.wait(1.0)
                return None
            when, _, run, task, loop, fired = self._heap[0]
            wait = when - time.monotonic()
            if wait > 0:
                self._cond.wait(wait)
                return None
            heapq.heappop(self._heap)
            if run.done:
                return None
            run.done = run.fired = True  # the task's own end now changes nothing
            self._active -= 1
            seconds = run.limits.hard_timeout or 0.0
            fired.append(JobTimeout(f"job ran past its hard_timeout of {seconds:g}s",
                                    seconds=seconds, hard=True))
            return run, task, loop

    def _overran(self, run: Run, task: asyncio.Task[Any],
                 loop: asyncio.AbstractEventLoop) -> None:
        # The timer's hard-limit step: takes the job from the in-flight table,
        # settles it as a JobTimeout on a thread of its own and recycles the process.
        self.timer._overran(run)
        with contextlib.suppress(RuntimeError):  # the loop closed: the task went with it
            loop.call_soon_threadsafe(task.cancel)
        if run.reported:
            self.timer._note(b"-" + dumps([run.jid]).encode() + b"\n")

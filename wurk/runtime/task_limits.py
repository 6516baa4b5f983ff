"""Soft and hard time limits for a job running as a task of the asyncio executor.

A task is not a thread: no async exception is ever raised for it
(``PyThreadState_SetAsyncExc`` is for the threads executor's job timer).

Duties:
1. Soft limit (``timeout``): at the deadline the job's task is cancelled
   (``CancelledError`` inside the job at its next ``await``) and the run
   fails with :class:`~wurk.runtime.time_limits.JobTimeout`, retried as
   usual; once a limit fired, the run fails with it even if the job swallowed
   the cancellation and returned (as in the threads executor).
2. Hard limit (``hard_timeout``): the process's job timer keeps it
   (``JobTimer.arm_task``), on its own thread, not the loop, which a
   coroutine stuck in sync code holds: at the deadline it takes the job
   from the in-flight table, has it settled as a JobTimeout failure, asks
   the process to recycle, and has the task cancelled. A swarm parent is
   told the hard deadline at start and the end of the run, as for a thread
   (it KILLs a child too wedged to get there itself).
3. The end of a run and a firing limit are decided under one lock: a run
   that ended is never settled as overrun, and the outcome of one that
   overran is dropped. The loop's soft-limit handle goes when the run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.runtime.job_timer import JobTimer, Run
from wurk.runtime.time_limits import JobTimeout, Limits

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.job_timer")


def make_run(slot: str, work: UnitOfWork, jid: str | None, options: JobOptions | None,
             limits: Limits) -> Run:
    """The timer's record of one bounded run; tid 0: there is no thread to raise in."""
    return Run(0, slot, work, jid, options, limits)


async def bounded(timer: JobTimer, run: Run, step: Awaitable[Any]) -> Any:
    """Await ``step`` (the job's chain, in this task) under ``run.limits``."""
    limits = run.limits
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a job's time limits need the job's own task")
    loop = asyncio.get_running_loop()
    fired = run.timeouts
    soft = (None if limits.timeout is None
            else loop.call_later(limits.timeout, _soft, task, run, fired))
    if limits.hard_timeout is not None:
        timer.arm_task(run, task, loop)
    try:
        value = await step
    except asyncio.CancelledError:
        if not fired:
            raise  # a stop, or the job's own doing
        task.uncancel()
        raise fired[0] from None
    finally:
        if limits.hard_timeout is not None:
            timer.end_task(run)
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

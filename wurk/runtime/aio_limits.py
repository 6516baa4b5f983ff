"""Soft and hard time limits for a job running as a task of the asyncio executor.

A task is not a thread: no async exception is ever raised for it
(``PyThreadState_SetAsyncExc`` is for the threads executor's job timer).

Duties:
1. Soft limit (``timeout``): at the deadline the job's task is cancelled
   (``CancelledError`` inside the job at its next ``await``) and the run
   fails with :class:`~wurk.runtime.time_limits.JobTimeout`, retried as
   usual; once a limit fired, the run fails with it even if the job swallowed
   the cancellation and returned (as in the threads executor).
2. Hard limit (``hard_timeout``): the job timer's own hard-limit step runs
   (``JobTimer._overran``: it takes the job from the in-flight table, settles
   it as a JobTimeout failure through the atomic settle, and asks the process
   to recycle), and the task is cancelled. A swarm parent is told the hard
   deadline at start and the end of the run, as for a thread (it KILLs a child
   too wedged to get there itself).
3. The loop's timer handles go when the run ends, however it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

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


async def bounded(timer: JobTimer, run: Run, step: Awaitable[Any]) -> Any:
    """Await ``step`` (the job's chain, in this task) under ``run.limits``."""
    limits = run.limits
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a job's time limits need the job's own task")
    loop = asyncio.get_running_loop()
    fired: list[JobTimeout] = []
    handles = []
    if limits.timeout is not None:
        handles.append(loop.call_later(limits.timeout, _soft, task, run, fired))
    if limits.hard_timeout is not None:
        handles.append(loop.call_later(limits.hard_timeout, _hard, timer, task, run, fired))
        timer._note_start(run)  # the timer's own note, for a task
    try:
        value = await step
    except asyncio.CancelledError:
        if not fired:
            raise  # a stop, or the job's own doing
        task.uncancel()
        raise fired[0] from None
    finally:
        run.done = True
        for handle in handles:
            handle.cancel()
        if run.reported:
            timer._note(b"-" + dumps([run.jid]).encode() + b"\n")
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


def _hard(timer: JobTimer, task: asyncio.Task[Any], run: Run, fired: list[JobTimeout]) -> None:
    if task.done() or run.done:
        return
    seconds = run.limits.hard_timeout or 0.0
    if not fired:
        fired.append(JobTimeout(f"job ran past its hard_timeout of {seconds:g}s",
                                seconds=seconds, hard=True))
    # Settles it from a thread of its own and recycles the process; the task's
    # own outcome is dropped (the in-flight table no longer holds it for us).
    timer._overran(run)  # the timer's hard-limit step, for a task
    task.cancel()

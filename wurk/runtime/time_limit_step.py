"""Time limits as a step of the job's lifecycle: soft and hard limits.

1. ``around`` / ``around_async``: a job with a ``timeout`` or
   ``hard_timeout`` runs under the process's job timer
   (``wurk.runtime.job_timer`` for a thread, ``wurk.runtime.task_limits``
   for a task).
2. ``took``: a hard limit's JobTimeout is raised only after the timer took
   the run and settled it (``job.hard_timeout``): no second outcome line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wurk.runtime import task_limits, time_limits
from wurk.runtime.lifecycle.step import AsyncCall, Call, Run, Step

if TYPE_CHECKING:
    from wurk.push.job import Registered
    from wurk.runtime.job_timer import JobTimer


class TimeLimitStep(Step):
    name = "time_limits"

    def __init__(self, timer: JobTimer) -> None:
        self.timer = timer

    def applies(self, job: dict[str, Any], entry: Registered | None) -> bool:
        if "timeout" in job or "hard_timeout" in job:
            return True
        options = entry.options if entry is not None else None
        return options is not None and (options.timeout is not None
                                        or options.hard_timeout is not None)

    def _limits(self, run: Run) -> time_limits.Limits:
        return time_limits.limits_of(run.job, run.options, run.notes)

    def around(self, run: Run, call: Call) -> Call:
        limits = self._limits(run)
        if not limits.bounded:
            return call
        return lambda: self.timer.run(run.slot, run.work, run.job, run.options,
                                      limits=limits, call=call)

    def around_async(self, run: Run, call: AsyncCall) -> AsyncCall:
        limits = self._limits(run)
        if not limits.bounded:
            return call
        timed = task_limits.make_run(run.slot, run.work, run.jid, run.options, limits)
        return lambda: task_limits.bounded(self.timer, timed, call())

    def took(self, run: Run, failure: BaseException) -> bool:
        return time_limits.settled_by_timer(failure)

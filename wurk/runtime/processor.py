"""The threads executor's processor: drives one fetched job through its lifecycle on this thread.

The run itself (decode, admit, start, settle, and every feature's part in
them) is the skeleton's (``wurk.runtime.lifecycle``); this driver adds what
is particular to running a job on a thread:

1. The job's code, inside the server middleware chain, wrapped by the steps'
   ``around`` hooks (the job timer, a profiler), with one line at its start
   and one at its end. An ``async def`` job waits on the process's event
   loop (``wurk.runtime.event_loop``), this thread blocked meanwhile.
2. Whatever the job or its middleware raises, ``SystemExit`` and
   ``KeyboardInterrupt`` included, is the job's failure: nothing a job does
   ends the thread. A step's own error around the job (a profiler's) is the
   run's failure too, its outcome unknown, logged as ``job.run_error``.

Nothing a job or Redis does makes ``process`` raise; anything that still
does is a bug of ours, left to the manager's guard, which gives the job
back (``Crew.give_back``, :mod:`wurk.runtime.crew`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from wurk.core import logging as wlog
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push.job import UnknownJobError
from wurk.runtime import event_loop, middleware
from wurk.wire import keywords

if TYPE_CHECKING:
    from wurk.runtime.lifecycle.skeleton import Lifecycle
    from wurk.runtime.lifecycle.step import Run
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.processor")


class Processor:
    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def process(self, work: UnitOfWork, slot: str) -> None:
        lifecycle = self.lifecycle
        run = lifecycle.open(work, slot)
        if run is None:
            return
        # Anything raised past here is a bug of ours, not the job's: the slot
        # stays recorded, and the manager's guard gives its job back.
        plan = run.plan
        if plan.admit and not lifecycle.admit(run):
            return
        if plan.start:
            lifecycle.start(run)
        if plan.enter:
            lifecycle.enter(run)
            try:
                failure = self._execute(run)
            finally:
                lifecycle.exit(run)
        else:
            failure = self._execute(run)
        if failure is None:
            lifecycle.succeeded(run)
        else:
            lifecycle.failed(run, failure)

    def _execute(self, run: Run) -> BaseException | None:
        try:
            if run.plan.around:
                return self.lifecycle.around(run, lambda: self._perform(run))()  # type: ignore[no-any-return]
            return self._perform(run)
        except BaseException as exc:  # noqa: BLE001 - a step's error around the job: outcome unknown
            log.error("job.run_error", jid=run.jid, error=describe(exc))
            return exc

    def _perform(self, run: Run) -> BaseException | None:
        """The job in its middleware chain; its failure, or None."""
        tid = wlog.tid()
        lines = self.lifecycle.lines(run, tid)
        started = time.perf_counter()
        job, entry = run.job, run.entry
        try:
            if entry is None:
                raise UnknownJobError.for_name(job["class"])
            perform = entry.factory(job)
            if entry.coroutine:  # on the process's event loop, this thread waiting
                perform = event_loop.blocking(perform)

            def call() -> Any:
                args, kwargs = keywords.split(job)
                run.value = value = perform(*args, **kwargs)
                return value  # what the middleware's call_next returns

            middleware.invoke(self.lifecycle.config.server_middleware, job, run.queue, call)
        except BaseException as exc:  # noqa: BLE001 - the job's failure, whatever it is
            self.lifecycle.ran(run, lines, exc, started, tid)
            return exc
        self.lifecycle.ran(run, lines, None, started, tid)
        return None

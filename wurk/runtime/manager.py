"""The manager: a process's pool of processor threads and what they hold.

Duties:
1. Start ``concurrency`` processor threads (under :mod:`wurk.core.threads`) that
   fetch and process until quiet. Anything raised outside a job's own run (a
   fetch, the processor's bookkeeping) is logged, the job the thread held goes
   back to its queue, and the thread carries on after a pause; a thread that
   dies anyway gives back its job the same way and is restarted.
2. Drive the process's :class:`~wurk.runtime.crew.Crew` (the fetch, the
   lifecycle, the in-flight table and counters the processors fill and the
   heartbeat publishes), which it holds, as the asyncio executor holds its
   own; a hard stop requeues from the table.
3. ``quiet`` stops fetching; ``stop(deadline)`` waits for running jobs until
   the deadline, then pushes whatever is still running back to its queue in
   one pipeline and marks those slots so their late outcome is dropped (a
   failure still waiting to be written stops retrying: ``wait_abandoned``);
   the coroutines of async jobs handed back are cancelled (``wurk.runtime.event_loop``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from wurk.core import logging as wlog
from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.runtime import event_loop
from wurk.runtime.crew import CrewDriver

if TYPE_CHECKING:
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.manager")
# After a fetch or a processor failed outside a job: no spin if it keeps failing.
ERROR_PAUSE = 1.0
# The most a stop waits for cancelled async jobs to unwind (they do at their next await).
UNWIND_SECONDS = 1.0


class Manager(CrewDriver):
    def start(self) -> None:
        self.fetch.start()
        for index in range(self.config.concurrency):
            self._threads.append(threads.start("processor", self._work_loop,
                                               stopped=self._quiet.is_set,
                                               name=f"wurk-processor-{index}"))

    def _work_loop(self) -> None:
        # Base 36 of the native thread id: unique in this process, short, and
        # the shape Sidekiq uses for its work-hash fields.
        slot = wlog.tid()
        try:
            while not self._quiet.is_set():
                work = None
                try:
                    work = self.fetch.fetch()
                    if work is not None:
                        self.processor.process(work, slot)
                except BaseException as exc:  # noqa: BLE001 - nothing may kill the thread
                    self._failed_outside_job(slot, work, exc)
        finally:
            # Died mid-job after all: its job must not wait in a slot nobody runs.
            self.crew.give_back(slot, None)

    def _failed_outside_job(self, slot: str, work: UnitOfWork | None,
                            exc: BaseException) -> None:
        if work is None:
            log.error("fetch.error", error=threads.describe(exc))
        else:
            log.error("processor.error", queue=work.queue, error=threads.describe(exc))
            self.crew.give_back(slot, work)
        self._quiet.wait(ERROR_PAUSE)

    def stop(self, deadline: float) -> int:
        """Quiet, wait for running jobs until ``deadline`` (monotonic), requeue the rest.

        Returns how many jobs were pushed back.
        """
        self.quiet()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        leftovers = self.in_flight.abandon_all()
        requeued = self.crew.requeue(leftovers)
        if leftovers:  # their async jobs stop at their next await, not at exit
            idents = (t.ident for t in self._threads if t.ident is not None)
            self._unwind(event_loop.cancel_all(idents))
        self.timer.stop()
        self.fetch.stop()
        self.crew.drain_fetches()
        return requeued

    def _unwind(self, tids: set[int]) -> None:
        """Give the threads whose coroutines a stop cancelled a moment to see
        it: each then unwinds and logs its job as handed back, which an exit
        right away would cut short."""
        limit = time.monotonic() + UNWIND_SECONDS
        for thread in self._threads:
            if thread.ident in tids:
                thread.join(max(0.0, limit - time.monotonic()))

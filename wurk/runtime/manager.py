"""The manager: a process's pool of processor threads and what they hold.

Duties:
1. Start ``concurrency`` processor threads (under :mod:`wurk.core.threads`) that
   fetch and process until quiet. Anything raised outside a job's own run (a
   fetch, the processor's bookkeeping) is logged, the job the thread held goes
   back to its queue, and the thread carries on after a pause; a thread that
   dies anyway gives back its job the same way and is restarted.
2. Own the process's in-flight table and counters (:mod:`wurk.runtime.inflight`),
   which the processors fill and the heartbeat publishes; a hard stop
   requeues from the table.
3. ``quiet`` stops fetching; ``stop(deadline)`` waits for running jobs until
   the deadline, then pushes whatever is still running back to its queue in
   one pipeline and marks those slots so their late outcome is dropped (a
   failure still waiting to be written stops retrying: ``wait_abandoned``);
   the coroutines of async jobs handed back are cancelled (``wurk.runtime.aio``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from wurk.core import logging as wlog
from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.redis.pools import pool_for
from wurk.runtime import aio
from wurk.runtime.fetch import BasicFetch
from wurk.runtime.inflight import Counters, InFlightTable, Running
from wurk.runtime.processor import Processor
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.runtime.work import Fetch, UnitOfWork

if TYPE_CHECKING:
    from wurk.push.job import Registry
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.manager")
# After a fetch or a processor failed outside a job: no spin if it keeps failing.
ERROR_PAUSE = 1.0
# The most a stop waits for cancelled async jobs to unwind (they do at their next await).
UNWIND_SECONDS = 1.0


class Manager:
    def __init__(self, config: Config, plan: QueuePlan, registry: Registry,
                 identity: str) -> None:
        self.config = config
        self.counters = Counters()
        self.in_flight = InFlightTable()
        self.fetch: Fetch = (ReliableFetch(config, plan, identity) if config.reliable_fetch
                             else BasicFetch(config, plan))
        self.processor = Processor(config, registry, self.fetch, self.counters, self.in_flight)
        self._quiet = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.fetch.start()
        for index in range(self.config.concurrency):
            self._threads.append(threads.start("processor", self._work_loop,
                                               stopped=self._quiet.is_set,
                                               name=f"wurk-processor-{index}"))

    @property
    def quieting(self) -> bool:
        return self._quiet.is_set()

    def quiet(self) -> None:
        self._quiet.set()
        self.fetch.quiet()

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
            self._give_back(slot, None)

    def _failed_outside_job(self, slot: str, work: UnitOfWork | None,
                            exc: BaseException) -> None:
        if work is None:
            log.error("fetch.error", error=threads.describe(exc))
        else:
            log.error("processor.error", queue=work.queue, error=threads.describe(exc))
            self._give_back(slot, work)
        self._quiet.wait(ERROR_PAUSE)

    def _give_back(self, slot: str, work: UnitOfWork | None) -> None:
        """Requeue the job this slot still holds (else ``work``), unless a hard stop did.

        It may have run in part: at least once, as after a hard stop.
        """
        running = self.in_flight.take(slot)
        if running is not None:
            if running.abandoned:
                return
            work = running.work
        if work is None:
            return
        try:
            self.fetch.requeue([work])
        except BaseException as error:  # noqa: BLE001 - the log line keeps the job
            log.error("job.lost", queue=work.queue, error=threads.describe(error),
                      payload=work.raw.decode("utf-8", "replace"))
            return
        log.warning("processor.requeued", queue=work.queue)

    def stop(self, deadline: float) -> int:
        """Quiet, wait for running jobs until ``deadline`` (monotonic), requeue the rest.

        Returns how many jobs were pushed back.
        """
        self.quiet()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        leftovers = self.in_flight.abandon_all()
        requeued = self._requeue(leftovers)
        if leftovers:  # their async jobs stop at their next await, not at exit
            self._unwind(aio.cancel_all(t.ident for t in self._threads if t.ident is not None))
        self.processor.timer.stop()
        self.fetch.stop()
        self._drain_fetches()
        return requeued

    def _unwind(self, tids: set[int]) -> None:
        """Give the threads whose coroutines a stop cancelled a moment to see
        it: each then unwinds and logs its job as handed back, which an exit
        right away would cut short."""
        limit = time.monotonic() + UNWIND_SECONDS
        for thread in self._threads:
            if thread.ident in tids:
                thread.join(max(0.0, limit - time.monotonic()))

    def _requeue(self, leftovers: list[Running]) -> int:
        if not leftovers:
            return 0
        jids = [r.job.get("jid") for r in leftovers]
        try:
            self.fetch.requeue([r.work for r in leftovers])
        except Exception as exc:  # noqa: BLE001
            log.error("shutdown.requeue_failed", jobs=len(leftovers), jids=jids, error=repr(exc))
            return 0
        log.warning("shutdown.requeued", jobs=len(leftovers), jids=jids)
        return len(leftovers)

    def _drain_fetches(self) -> None:
        """Wait for idle threads still blocked in BRPOP (a deadline shorter than
        ``fetch_timeout``). Whatever such a fetch returns, a requeued job
        included, its processor pushes back; the process must not exit before.
        """
        running = self.in_flight.slots()
        # Their BRPOPs end by the pool's deadline during a drain, and so does this wait.
        wait = pool_for(self.config).deadline.clip(self.config.fetch_timeout
                                              + self.config.redis_read_timeout)
        limit = time.monotonic() + (wait or 0.0)
        for thread in self._threads:
            if thread.native_id is not None and wlog.base36(thread.native_id) not in running:
                thread.join(max(0.0, limit - time.monotonic()))


"""The manager: a process's pool of processor threads and what they hold.

Duties:
1. Start ``concurrency`` processor threads (under :mod:`wurk.core.threads`) that
   fetch and process until quiet. Anything raised outside a job's own run (a
   fetch, the processor's bookkeeping) is logged, the job the thread held goes
   back to its queue, and the thread carries on after a pause; a thread that
   dies anyway gives back its job the same way and is restarted.
2. Keep the in-flight table (which slot runs which job since when) that the
   heartbeat publishes and a hard stop requeues from.
3. Count processed and failed executions between heartbeats.
4. ``quiet`` stops fetching; ``stop(deadline)`` waits for running jobs until
   the deadline, then pushes whatever is still running back to its queue in
   one pipeline and marks those slots so their late outcome is dropped (a
   failure still waiting to be written stops retrying: ``wait_abandoned``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wurk.core import logging as wlog
from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.runtime.fetch import BasicFetch, Fetch, UnitOfWork
from wurk.runtime.processor import Processor
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.push.job import Registry
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.runtime.manager")
# After a fetch or a processor failed outside a job: no spin if it keeps failing.
ERROR_PAUSE = 1.0


class Counters:
    """Processed/failed executions since the last heartbeat took them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.processed = 0
        self.failed = 0

    def record(self, *, failed: bool) -> None:
        with self._lock:
            self.processed += 1
            if failed:
                self.failed += 1

    def take(self) -> tuple[int, int]:
        with self._lock:
            taken = (self.processed, self.failed)
            self.processed = self.failed = 0
        return taken

    def give_back(self, processed: int, failed: int) -> None:
        with self._lock:
            self.processed += processed
            self.failed += failed


@dataclass
class Running:
    work: UnitOfWork
    job: dict[str, Any]
    run_at: float = field(default_factory=time.time)
    abandoned: bool = False


class InFlightTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Running] = {}
        self._closed = False
        self._abandoning = threading.Event()

    def begin(self, slot: str, work: UnitOfWork, job: dict[str, Any]) -> bool:
        """Record a job as running; False once a hard stop closed the table."""
        with self._lock:
            if self._closed:
                return False
            self._slots[slot] = Running(work, job)
            return True

    def finish(self, slot: str) -> bool:
        """Clear the slot; True if a hard stop already requeued its job."""
        running = self.take(slot)
        return running is not None and running.abandoned

    def take(self, slot: str) -> Running | None:
        """Clear the slot and return what it held."""
        with self._lock:
            return self._slots.pop(slot, None)

    def abandoned(self, slot: str) -> bool:
        """True once a hard stop took the slot's job (it stays recorded until ``finish``)."""
        with self._lock:
            running = self._slots.get(slot)
        return running is not None and running.abandoned

    def wait_abandoned(self, slot: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for a hard stop; whether it took the slot's job."""
        self._abandoning.wait(timeout)
        return self.abandoned(slot)

    def busy(self) -> int:
        return len(self._slots)

    def abandon_all(self) -> list[Running]:
        with self._lock:
            self._closed = True
            running = [r for r in self._slots.values() if not r.abandoned]
            for r in running:
                r.abandoned = True
        self._abandoning.set()
        return running

    def work_hash(self) -> dict[str, str]:
        """Field -> JSON as Sidekiq's Workers API reads it (payload as a string)."""
        with self._lock:
            items = list(self._slots.items())
        return {
            slot: dumps({"queue": r.work.queue,
                         "payload": r.work.raw.decode("utf-8", "replace"),
                         "run_at": int(r.run_at)})
            for slot, r in items
        }

    def slots(self) -> set[str]:
        with self._lock:
            return set(self._slots)

    def running_jobs(self) -> list[Running]:
        with self._lock:
            return list(self._slots.values())


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
        self.fetch.stop()
        self._drain_fetches()
        return requeued

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
        wait = self.config.pool.deadline.clip(self.config.fetch_timeout
                                              + self.config.redis_read_timeout)
        limit = time.monotonic() + (wait or 0.0)
        for thread in self._threads:
            if thread.native_id is not None and wlog.base36(thread.native_id) not in running:
                thread.join(max(0.0, limit - time.monotonic()))


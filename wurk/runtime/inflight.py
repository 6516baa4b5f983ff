"""What a process is running now, and what it ran since the last heartbeat.

The manager owns one of each; processors write to them as jobs start and
end, the heartbeat reads them, and a hard stop requeues what the table still
holds. They sit below all three so the path of a job never climbs back up.

Duties:
1. :class:`InFlightTable`: which processor slot runs which job since when,
   and which runs a stop abandoned or the job timer took over past their
   hard limit (their late outcome is dropped).
2. :class:`Counters`: processed and failed executions between heartbeats,
   taken atomically and given back when a beat fails, and the per-class
   figures (``classes``, :class:`wurk.observe.class_metrics.ClassMetrics`)
   the same heartbeat writes; ``on_record``, when set, is told of each
   (``max_jobs``: :mod:`wurk.runtime.recycling`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wurk.observe.class_metrics import ClassMetrics
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.runtime.work import UnitOfWork


class Counters:
    """Processed/failed executions since the last heartbeat took them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.processed = 0
        self.failed = 0
        self.classes = ClassMetrics()
        # Called after each recorded execution, outside the lock.
        self.on_record: Callable[[], None] | None = None

    def record(self, *, failed: bool) -> None:
        with self._lock:
            self.processed += 1
            if failed:
                self.failed += 1
        if self.on_record is not None:
            self.on_record()

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

    def take_over(self, slot: str, work: UnitOfWork) -> Running | None:
        """Mark the slot's job taken (as a stop would), if it still runs ``work``.

        The job timer settles a job past its hard limit itself; whatever the
        job then returns with is dropped, and a stop does not requeue it.
        """
        with self._lock:
            running = self._slots.get(slot)
            if running is None or running.work is not work or running.abandoned:
                return None
            running.abandoned = True
            return running

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

"""Running collected jobs in testing mode: the real job lifecycle, settled in memory.

A job runs exactly as a worker runs it: the threads executor
(:class:`wurk.runtime.processor.Processor`) drives it through the job
lifecycle's skeleton (:class:`wurk.runtime.lifecycle.skeleton.Lifecycle`):
decode the payload as written, admit (expiry), the application's server
middleware, the job's code, then settle it as a success, a retry, dead or
dropped with the real retry handler (its count, its backoff, ``retry_in``,
``retries_exhausted``, the death handlers). Only the settlement's
destination differs:

1. :class:`MemoryFetch` takes the acknowledgement and the settle, and puts a
   retry or dead entry in the box instead of Redis.
2. :class:`MemoryStep`, the one feature step of this lifecycle, keeps in
   memory what the Redis-writing steps keep in Redis: the unique lock's
   release (at start or at the end, as ``unique_until`` says) and the
   job's result (``store_result``); and it notes each run's ending, so a
   caller can re-raise the job's own exception.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wurk.expiry.step import ExpiryStep
from wurk.push.job import registry
from wurk.results import records as results
from wurk.runtime.inflight import Counters, InFlightTable
from wurk.runtime.lifecycle.skeleton import Lifecycle
from wurk.runtime.lifecycle.step import SKIPPED, Ending, Run, Step
from wurk.runtime.processor import Processor
from wurk.runtime.retry import RetryHandler, exception_message
from wurk.runtime.work import Sender, Settlement, UnitOfWork
from wurk.testing.box import FakeJob
from wurk.unique import keys as unique

if TYPE_CHECKING:
    from wurk.runtime.lifecycle.writes import Write
    from wurk.settings.config import Config
    from wurk.testing.box import Box

_slots = itertools.count()


@dataclass
class Ran:
    """How one run ended: "success", "retry", "dead" or "dropped"."""

    outcome: str = "success"
    failure: BaseException | None = None


class MemoryFetch:
    """The fetch side a processor settles through, with the box for Redis."""

    def __init__(self, box: Box, endings: dict[str, Ran]) -> None:
        self.box = box
        self.endings = endings  # each running jid's ending: a dead entry's error

    def start(self) -> None:
        return None

    def quiet(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def fetch(self) -> UnitOfWork | None:
        return None

    def acknowledge(self, work: UnitOfWork, jid: str | None = None,
                    send: Sender | None = None) -> None:
        return None

    def settle(self, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
        if settlement.outcome in ("retry", "schedule"):
            entry = FakeJob.entry(settlement.entry, settlement.at)
            with self.box.lock:
                self.box.retries.append(entry)
        elif settlement.outcome == "dead":
            ending = self.endings.get(jid or "")
            error = ending.failure if ending is not None else None
            with self.box.lock:
                self.box.dead.append(FakeJob.entry(settlement.entry, settlement.at, error))
        return True

    def requeue(self, works: Iterable[UnitOfWork]) -> int:
        jobs = [FakeJob.entry(work.raw) for work in works]
        with self.box.lock:
            self.box.pending[:0] = jobs
        return len(jobs)


class MemoryStep(Step):
    """Unique releases, results and each run's ending, kept in the box."""

    name = "testing"
    every_job = True

    def __init__(self, box: Box, endings: dict[str, Ran]) -> None:
        self.box = box
        self.endings = endings

    def start(self, run: Run) -> None:
        if unique.LOCK in run.job and unique.until_of(run.job) == unique.START:
            self.box.release(run.job)

    def concluding(self, run: Run, ending: Ending) -> list[Write]:
        self.endings[run.jid or ""] = Ran(ending.outcome, ending.failure)
        job = run.job
        if (unique.LOCK in job and ending.outcome != "retry"
                and unique.until_of(job) == unique.SUCCESS):
            self.box.release(job)
        if results.TTL in job and run.jid is not None:
            self._store(run, ending)
        return []

    def _store(self, run: Run, ending: Ending) -> None:
        # The record the results step would write, read back as wurk.result
        # reads it: a value JSON cannot carry fails here as it would there.
        job, jid, now = run.job, run.jid or "", time.time()
        if ending.failure is None:
            record, _ = results.success_record(job, None if run.value is SKIPPED else run.value,
                                               now)
        else:
            record = results.error_record(job, type(ending.failure).__name__,
                                          exception_message(ending.failure),
                                          ending.outcome in ("dead", "dropped"), now)
        with self.box.lock:
            self.box.results[jid] = results.parse(jid, record)


class Runner:
    """Runs one job at a time through the lifecycle, on the caller's thread."""

    def __init__(self, config: Config, box: Box) -> None:
        self.endings: dict[str, Ran] = {}
        steps = [ExpiryStep(config), MemoryStep(box, self.endings)]
        lifecycle = Lifecycle(config, registry, MemoryFetch(box, self.endings), Counters(),
                              InFlightTable(), retry=RetryHandler(config), steps=steps)
        self.processor = Processor(lifecycle)

    def run(self, job: FakeJob) -> Ran:
        """Run ``job`` as a worker would; how it ended."""
        raw = job.raw.encode("utf-8", "surrogatepass")
        # A slot of its own: a job run inline may push (and run) another inside it.
        self.processor.process(UnitOfWork(job.queue, raw), f"testing-{next(_slots)}")
        # No ending noted: the payload was no job (it went to dead as it was).
        return self.endings.pop(job.jid, None) or Ran("dead")

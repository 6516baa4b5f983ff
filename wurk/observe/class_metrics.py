"""Per-class execution metrics in Sidekiq 7's Redis format, recorded in memory.

Sidekiq 7's Web has a Metrics page fed by what each process records: per
class and per minute, executions, failures and the milliseconds of the
successful runs, plus a histogram of run times. wurk records the same keys,
so Sidekiq 7's Web shows wurk's classes and wurk's dashboard shows Ruby's.

Duties:
1. :class:`ClassMetrics`: one per process's counters. :meth:`ClassMetrics.record`
   is all a job pays: one lock, a few dict additions and a bisect into the 26
   histogram buckets. Nothing touches Redis per job.
2. :meth:`ClassMetrics.take` / :meth:`ClassMetrics.give_back`: the heartbeat
   takes what piled up since its last beat and, when the beat's transaction
   never reached Redis, gives it back for the next one.
3. :func:`flush_commands`: the writes for one beat, which the heartbeat
   sends in one pipeline after its counts: per class ``HINCRBY``
   on ``j|YYYYMMDD|H:M`` (fields ``Class|p``, ``Class|f``, ``Class|ms``) and
   ``BITFIELD Class-DD-HH:M OVERFLOW SAT INCRBY u16 #i n``; each key
   expires after :data:`TTL` (8 hours), as Sidekiq 7 sets it.
4. :func:`tracked`: wraps the processor's run so each run is recorded (ActiveJob's
   ``wrapped`` class when there is one); the run is untouched when the
   ``class_metrics`` setting is off.
5. Key names and bucket limits (:func:`minute_key`, :func:`histogram_key`,
   :data:`BUCKETS`, :data:`LABELS`) shared with the reader (``wurk.api.class_metrics``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from wurk.core.logging import get_logger
from wurk.limiter.base import reschedulable

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.class_metrics")
E = TypeVar("E")
RunJob = Callable[[dict[str, Any], str, E], "BaseException | None"]

TTL = 8 * 3600
# Upper bounds (ms, exclusive) of Sidekiq 7's histogram buckets; the last is "slow".
BUCKETS = (20, 30, 45, 65, 100, 150, 225, 335, 500, 750, 1100, 1700, 2500, 3800, 5750,
           8500, 13000, 20000, 30000, 45000, 65000, 100000, 150000, 225000, 335000)
LABELS = ("20ms", "30ms", "45ms", "65ms", "100ms", "150ms", "225ms", "335ms", "500ms",
          "750ms", "1.1s", "1.7s", "2.5s", "3.8s", "5.75s", "8.5s", "13s", "20s", "30s",
          "45s", "65s", "100s", "150s", "225s", "335s", "Slow")
SLOTS = len(LABELS)
U16_MAX = 65535
# A class name is whatever a payload says: a longer one is not recorded
# (it would cost a field that size in every minute's hash).
MAX_CLASS = 1024


def minute_key(at: datetime) -> str:
    """``j|20261130|7:3`` for 07:03 UTC: Sidekiq 7's minute hash (no leading zeros)."""
    return f"j|{at:%Y%m%d}|{at.hour}:{at.minute}"


def histogram_key(cls: str, at: datetime) -> str:
    """``Mailer-30-07:3``: Sidekiq 7's histogram (day and hour padded, minute not)."""
    return f"{cls}-{at:%d}-{at:%H}:{at.minute}"


def bucket_of(ms: float) -> int:
    return bisect.bisect_right(BUCKETS, ms)


@dataclass
class ClassCounts:
    processed: int = 0
    failed: int = 0
    ms: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * SLOTS)


Taken = dict[str, ClassCounts]


class ClassMetrics:
    """Executions, failures, time and a histogram per class since the last beat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._classes: Taken = {}

    def record(self, cls: str, ms: float, *, failed: bool) -> None:
        if len(cls) > MAX_CLASS:
            return
        with self._lock:
            counts = self._classes.get(cls)
            if counts is None:
                counts = self._classes[cls] = ClassCounts()
            counts.processed += 1
            if failed:
                # As Sidekiq: a failure's time is not counted (it says little).
                counts.failed += 1
            else:
                counts.ms += int(ms)
                counts.histogram[bucket_of(ms)] += 1

    def take(self) -> Taken:
        with self._lock:
            taken, self._classes = self._classes, {}
        return taken

    def give_back(self, taken: Taken) -> None:
        with self._lock:
            for cls, back in taken.items():
                counts = self._classes.setdefault(cls, ClassCounts())
                counts.processed += back.processed
                counts.failed += back.failed
                counts.ms += back.ms
                counts.histogram = [a + b for a, b in zip(counts.histogram, back.histogram,
                                                          strict=True)]


def flush_commands(taken: Taken, now: float | None = None) -> list[tuple[Any, ...]]:
    """One beat's writes, for a pipeline; empty when nothing ran."""
    if not taken:
        return []
    at = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    minute = minute_key(at)
    commands: list[tuple[Any, ...]] = []
    for cls, counts in taken.items():
        for suffix, value in (("p", counts.processed), ("f", counts.failed), ("ms", counts.ms)):
            if value:
                commands.append(("HINCRBY", minute, f"{cls}|{suffix}", value))
        increments: list[Any] = []
        for index, count in enumerate(counts.histogram):
            if count:
                increments += ["INCRBY", "u16", f"#{index}", min(count, U16_MAX)]
        if increments:
            key = histogram_key(cls, at)
            commands += [("BITFIELD", key, "OVERFLOW", "SAT", *increments),
                         ("EXPIRE", key, TTL)]
    commands.append(("EXPIRE", minute, TTL))
    return commands


def job_class(job: dict[str, Any]) -> str:
    return str(job.get("wrapped") or job.get("class"))


def tracked(config: Config, recorder: ClassMetrics, run: RunJob[E]) -> RunJob[E]:
    """``run``, each call recorded in ``recorder``; ``run`` itself when the setting is off."""
    if not config.class_metrics:
        return run

    def recorded(job: dict[str, Any], queue: str, entry: E) -> BaseException | None:
        started = time.perf_counter()
        failure = run(job, queue, entry)
        try:
            failed = failure is not None and not reschedulable(failure, job)
            recorder.record(job_class(job), (time.perf_counter() - started) * 1000.0,
                            failed=failed)
        except BaseException as exc:  # noqa: BLE001 - a metrics bug must not touch the job
            log.warning("class_metrics.record_failed", error=f"{type(exc).__name__}: {exc}")
        return failure

    return recorded

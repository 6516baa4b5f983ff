"""Recycling by count: a worker process that has run its share of jobs makes way.

A process that runs application code for days may grow (a leak, a cache, a
fragmented heap) in ways no single job shows. As gunicorn's
``max_requests`` and Celery's ``max_tasks_per_child`` do, ``max_jobs`` lets
such a process stop after a number of jobs; the launcher's recycle path
stops it as a TERM would (no more fetches, running jobs finish), and its
owner starts a fresh one (the swarm forks a new child, ``wurk run`` exits
for its process manager).

Duties:
1. :func:`job_limit`: the number of jobs this process runs, drawn once:
   ``max_jobs`` plus a uniform draw of 0 to ``max_jobs_jitter`` (unset: a
   tenth of ``max_jobs``), so children forked together do not all stop
   together and leave a slot empty at once. Pure, the rng injected.
2. :class:`JobBudget`: counts jobs as they end (the manager's counters call
   :meth:`JobBudget.spend` for each one, whatever its outcome, as Sidekiq's
   ``processed`` count does) and calls ``on_spent`` once, from the thread
   whose job reached the limit; an error there is logged, never raised
   into that job's settling.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from wurk.core.logging import get_logger
from wurk.core.threads import describe

log = get_logger("wurk.launcher")
# Unset max_jobs_jitter: this fraction of max_jobs.
DEFAULT_JITTER = 0.1


def job_limit(max_jobs: int | None, jitter: int | None,
              rng: random.Random | None = None) -> int | None:
    """How many jobs this process runs before it recycles; None for no limit."""
    if max_jobs is None:
        return None
    spread = int(max_jobs * DEFAULT_JITTER) if jitter is None else jitter
    draw = (rng or random).random()  # [0, 1): each of 0..spread equally likely
    return max_jobs + min(spread, int(draw * (spread + 1)))


class JobBudget:
    """Jobs left before the process recycles; thread-safe."""

    def __init__(self, limit: int, on_spent: Callable[[], None]) -> None:
        self.limit = limit
        self.spent = 0
        self._on_spent = on_spent
        self._lock = threading.Lock()

    def spend(self) -> None:
        """One job ended; the one that reaches the limit calls ``on_spent``."""
        with self._lock:
            self.spent += 1
            reached = self.spent == self.limit
        if reached:
            try:
                self._on_spent()
            except Exception as exc:  # noqa: BLE001 - the job that reached it is still settling
                log.error("launcher.recycle_failed", reason="max_jobs", error=describe(exc))

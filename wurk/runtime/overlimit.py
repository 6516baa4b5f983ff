"""A job that hit a limiter: rescheduled with backoff, without spending a retry.

Sidekiq Enterprise's contract: a job whose ``acquire`` raised
:class:`~wurk.limiter.OverLimit` goes back to the ``schedule`` set, for the
same queue, with its ``overrated`` counter one higher and its
``retry_count`` untouched. Past the limiter's ``reschedule`` cap (20 unless
the limiter says otherwise; 0 turns rescheduling off) the OverLimit fails
the job as any error does, through the retry path.

Duties:
1. :func:`plan`: the :class:`~wurk.runtime.work.Settlement` that puts the
   job in ``schedule`` at now + backoff, or None when the failure is an
   ordinary one. The processor writes it with the atomic settle
   (``wurk.runtime.settle``), so the claimed copy leaves its private list in
   the same step the scheduled copy is written.
2. The delay: the limiter's own ``backoff(overrated)`` if it has one (a
   broken one, or one that returns no usable number, falls back), else
   ``300 * overrated + rand(300) + 1`` seconds (Sidekiq Enterprise's).
3. Count it: ``wurk.jobs.overlimit`` per class and queue, when metrics are on.
"""

from __future__ import annotations

import math
import random
import time
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.limiter.base import OverLimit, reschedulable
from wurk.limiter.policy import overrated_count, reschedule_delay
from wurk.observe import metrics
from wurk.runtime.lifecycle.step import Ending, Run, Step
from wurk.runtime.work import Settlement
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.limiter.base import Limiter
    from wurk.settings.config import Config

log = get_logger("wurk.limiter")
# A backoff beyond a year is a bug in the function that returned it.
MAX_DELAY = 366 * 86_400.0


class OverLimitStep(Step):
    """Takes a limiter's OverLimit as a reschedule: not a failure, no retry spent."""

    name = "over_limit"

    def __init__(self, config: Config, rng: random.Random) -> None:
        self.config = config
        self.rng = rng

    def excuses(self, run: Run, failure: BaseException) -> bool:
        return reschedulable(failure, run.job)

    def reschedule(self, run: Run, failure: BaseException) -> Settlement | None:
        try:
            settlement = plan(self.config, run.job, run.queue, failure, rng=self.rng)
        except BaseException as unwritable:  # noqa: BLE001 - fails as an ordinary error instead
            log.error("limiter.unreschedulable", jid=run.jid, error=describe(unwritable))
            return None
        if settlement is not None:
            run.notes[self.name] = settlement.at
        return settlement

    def concluded(self, run: Run, ending: Ending) -> None:
        log.info("job.over_limit", jid=run.jid, queue=run.queue,
                 overrated=run.job["overrated"], at=round(run.notes[self.name], 3))


def plan(config: Config, job: dict[str, Any], queue: str, exc: BaseException, *,
         rng: random.Random, now: float | None = None) -> Settlement | None:
    """The reschedule of a job that raised OverLimit, or None to fail it as usual.

    Raises only if the job cannot be serialised (the caller then fails it).
    """
    if not isinstance(exc, OverLimit):
        return None
    count = overrated_count(job.get("overrated")) + 1
    if not reschedulable(exc, job):
        job["overrated"] = min(count, exc.limiter.reschedule + 1)
        return None
    job["overrated"] = count
    job["queue"] = queue
    at = (time.time() if now is None else now) + delay(exc.limiter, count, rng)
    settlement = Settlement("schedule", dumps(job), at)
    observed = metrics.for_config(config)
    if observed is not None:
        observed.over_limit(metrics.job_class(job), queue)
    return settlement


def delay(limiter: Limiter, overrated: int, rng: random.Random) -> float:
    """Seconds until the rescheduled job runs again."""
    if limiter.backoff is not None:
        try:
            seconds = float(limiter.backoff(overrated))
            if math.isfinite(seconds) and 0 <= seconds <= MAX_DELAY:
                return seconds
            log.warning("limiter.backoff_unusable", limiter=limiter.name, value=repr(seconds))
        except BaseException as exc:  # noqa: BLE001 - a broken hook falls back to the default
            log.warning("limiter.backoff_failed", limiter=limiter.name, error=describe(exc))
    return reschedule_delay(overrated, rng)

"""Time limits as a worker reads them: expiry, soft and hard limits, the retry deadline.

Duties:
1. :class:`JobTimeout` (defined beside the options, so ``import wurk``
   loads no worker runtime for it), what a job past its limit raises.
2. :func:`read`: a job's limits, from its payload first (``expiry``,
   ``timeout``, ``hard_timeout``, ``deadline``, as a push wrote them) and
   its registered options second. A payload value that is not a usable
   number (a string, a bool, NaN, a huge or negative number) is treated as
   absent, with one ``job.bad_time_limit`` line for that job: garbage from
   Redis never crashes a processor nor drops a job.
3. :func:`drop_expired`: a job fetched after its ``expiry`` is not run. It
   is acknowledged (no retry, no dead entry), counted as processed (as
   Sidekiq Pro counts it), logged as ``job.expired`` with how late it was,
   and counted in ``wurk.jobs.expired`` when metrics are on.
4. :func:`past_deadline`: whether a retry at a given time would run after
   the job's ``deadline`` (the retry handler then sends it to dead).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.observe import metrics
from wurk.push.time_options import MAX_DURATION, MAX_EPOCH, JobTimeout

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.runtime.inflight import Counters
    from wurk.runtime.work import Fetch, UnitOfWork
    from wurk.settings.config import Config

log = get_logger("wurk.time_limits")
__all__ = ["NONE", "JobTimeout", "Limits", "deadline_of", "drop_expired", "past_deadline", "read"]


@dataclass(frozen=True)
class Limits:
    expiry: float | None = None
    timeout: float | None = None
    hard_timeout: float | None = None

    @property
    def bounded(self) -> bool:
        return self.timeout is not None or self.hard_timeout is not None


NONE = Limits()
_FIELDS = ("expiry", "timeout", "hard_timeout")


def _number(value: Any, ceiling: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 < number < ceiling else None


def read(job: dict[str, Any], options: JobOptions | None) -> Limits:
    """The job's limits; the common job with none set pays three dict lookups."""
    if ("expiry" not in job and "timeout" not in job and "hard_timeout" not in job
            and (options is None or (options.timeout is None and options.hard_timeout is None))):
        return NONE
    found = [job.get(name) for name in _FIELDS]
    values: list[float | None] = []
    bad: list[str] = []
    for name, value in zip(_FIELDS, found, strict=True):
        ceiling = MAX_EPOCH if name == "expiry" else MAX_DURATION
        number = _number(value, ceiling) if value is not None else None
        if value is not None and number is None:
            bad.append(name)
        if number is None and name != "expiry" and options is not None:
            number = getattr(options, name)
        values.append(number)
    if bad:
        log.warning("job.bad_time_limit", jid=job.get("jid"), fields=bad,
                    values=[repr(job.get(n))[:40] for n in bad])
    return Limits(*values)


def deadline_of(job: dict[str, Any], options: JobOptions | None) -> float | None:
    """The job's ``deadline``; a garbage payload value counts as none (logged)."""
    value = job.get("deadline")
    if value is None:
        return options.deadline if options is not None else None
    number = _number(value, MAX_EPOCH)
    if number is None:
        log.warning("job.bad_time_limit", jid=job.get("jid"), fields=["deadline"],
                    values=[repr(value)[:40]])
    return number


def past_deadline(deadline: float | None, retry_at: float) -> bool:
    """True when the next run would start after the deadline (so none is attempted)."""
    return deadline is not None and retry_at > deadline


def drop_expired(config: Config, job: dict[str, Any], work: UnitOfWork, fetch: Fetch,
                 counters: Counters, *, expiry: float) -> bool:
    """Acknowledge a job fetched past its expiry instead of running it; False if not expired."""
    late = time.time() - expiry
    if late <= 0:
        return False
    jid = job.get("jid") if isinstance(job.get("jid"), str) else None
    cls = metrics.job_class(job)
    log.info("job.expired", jid=jid, **{"class": cls}, queue=work.queue, late=round(late, 3))
    observed = metrics.for_config(config)
    if observed is not None:
        try:
            observed.expired(cls, work.queue)
        except Exception as exc:  # noqa: BLE001 - a metrics bug must not keep the job
            log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")
    counters.record(failed=False)
    fetch.acknowledge(work, jid)
    return True

"""Time limits as a worker reads them: expiry, soft and hard limits, the retry deadline.

Duties:
1. :class:`JobTimeout` (defined in ``wurk.core.job_errors``, so ``import
   wurk`` loads no worker runtime for it), what a job past its limit raises.
2. :func:`read`: a job's limits, from its payload first (``expiry``,
   ``timeout``, ``hard_timeout``, ``deadline``, as a push wrote them) and
   its registered options second. A payload value that is not a usable
   number (a string, a bool, NaN, a huge or negative number) is treated as
   absent, with one ``job.bad_time_limit`` line for that job: garbage from
   Redis never crashes a processor nor drops a job.
3. :func:`past_deadline`: whether a retry at a given time would run after
   the job's ``deadline`` (the retry handler then sends it to dead).
4. :func:`settled_by_timer`: whether a run's failure is its hard limit,
   whose outcome the job timer already settled and logged, so the
   executor that sees the job unwind logs no second outcome for the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.core.job_errors import JobTimeout
from wurk.core.logging import get_logger
from wurk.core.validate import finite_float
from wurk.push.time_options import MAX_DURATION, MAX_EPOCH

if TYPE_CHECKING:
    from wurk.push.options import JobOptions

log = get_logger("wurk.time_limits")
__all__ = ["NONE", "JobTimeout", "Limits", "deadline_of", "past_deadline", "read",
           "settled_by_timer"]


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
    number = finite_float(value)
    return number if number is not None and 0 < number < ceiling else None


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


def limits_of(job: dict[str, Any], options: JobOptions | None,
              notes: dict[str, Any]) -> Limits:
    """A run's limits, read once: the steps that need them share ``notes``' reading."""
    limits = notes.get("time_limits")
    if limits is None:
        limits = notes["time_limits"] = read(job, options)
    return limits


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


def settled_by_timer(exc: BaseException) -> bool:
    """A hard limit's JobTimeout: raised only after the timer took the run (job.hard_timeout)."""
    return isinstance(exc, JobTimeout) and exc.hard


def past_deadline(deadline: float | None, retry_at: float) -> bool:
    """True when the next run would start after the deadline (so none is attempted)."""
    return deadline is not None and retry_at > deadline

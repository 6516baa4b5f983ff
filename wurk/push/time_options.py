"""Time options of a job: expiry, soft and hard time limits, and a retry deadline.

Duties:
1. Check ``expires_in``, ``expires_at``, ``timeout``, ``hard_timeout`` and
   ``deadline`` where they are given (``@wurk.job``, ``wurk.Job`` options,
   ``.set(...)``), with a TypeError or ValueError that names the option: no
   bool, NaN, infinity, negative or zero value, no naive datetime, no
   ``hard_timeout`` below ``timeout``.
2. Turn absolute times (an epoch or an aware datetime) into epoch seconds,
   and keep ``expires_in`` and ``expires_at`` exclusive: setting one clears
   the other inherited from the class.
3. Stamp Sidekiq Pro's ``expiry`` field at push time (:func:`stamp_expiry`):
   the run time (now, or the scheduled time) plus ``expires_in``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from wurk.core.validate import is_number

# A duration this long is a mistake (an epoch passed as seconds), not a limit.
MAX_DURATION = 1_000_000_000.0
# Epoch seconds beyond this (year 5138) are garbage, not a time.
MAX_EPOCH = 1e11


DURATIONS = ("expires_in", "timeout", "hard_timeout")
MOMENTS = ("expires_at", "deadline")


def duration(name: str, value: Any) -> float:
    """A positive, finite number of seconds below :data:`MAX_DURATION`."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds >= MAX_DURATION:
        raise ValueError(f"{name} must be a positive, finite number of seconds "
                         f"below {MAX_DURATION:.0f}, got {value!r}")
    return seconds


def aware_epoch(name: str, value: datetime, error: type[Exception] = ValueError) -> float:
    """Epoch seconds of a timezone-aware datetime; ``error`` for a naive one."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{name} needs a timezone-aware datetime, got naive {value!r} "
                    "(use datetime.now(UTC) or .replace(tzinfo=...))")
    return value.timestamp()


def moment(name: str, value: Any) -> float:
    """Epoch seconds from an epoch number or a timezone-aware datetime."""
    if isinstance(value, datetime):
        return aware_epoch(name, value)
    if not is_number(value):
        raise TypeError(f"{name} must be epoch seconds or an aware datetime, got {value!r}")
    epoch = float(value)
    if not math.isfinite(epoch) or epoch < 0 or epoch >= MAX_EPOCH:
        raise ValueError(f"{name} must be finite epoch seconds, got {value!r}")
    return epoch


def check_changes(changes: dict[str, Any], base: Any) -> None:
    """Check and convert the time options in ``changes`` in place (``base``: inherited options)."""
    for name in DURATIONS:
        if changes.get(name) is not None:
            changes[name] = duration(name, changes[name])
    for name in MOMENTS:
        if changes.get(name) is not None:
            changes[name] = moment(name, changes[name])
    if changes.get("expires_in") is not None and changes.get("expires_at") is not None:
        raise ValueError("give expires_in or expires_at, not both")
    # A push's .set(expires_in=...) replaces the class's expires_at, and back.
    if changes.get("expires_in") is not None:
        changes.setdefault("expires_at", None)
    if changes.get("expires_at") is not None:
        changes.setdefault("expires_in", None)
    soft = changes.get("timeout", getattr(base, "timeout", None))
    hard = changes.get("hard_timeout", getattr(base, "hard_timeout", None))
    if soft is not None and hard is not None and hard < soft:
        raise ValueError(f"hard_timeout ({hard:g}) must not be below timeout ({soft:g})")


def payload_fields(options: Any) -> dict[str, Any]:
    """The time options a payload carries: ``expires_in`` becomes ``expiry`` at push."""
    fields: dict[str, Any] = {}
    for name, key in (("expires_in", "expires_in"), ("expires_at", "expiry"),
                      ("timeout", "timeout"), ("hard_timeout", "hard_timeout"),
                      ("deadline", "deadline")):
        value = getattr(options, name)
        if value is not None:
            fields[key] = value
    return fields


def stamp_expiry(payload: dict[str, Any], run_at: float | None, now: float) -> None:
    """Sidekiq Pro's rule: ``expiry`` = when the job is due (now or its ``at``) + expires_in.

    A payload that already has an ``expiry`` (a scheduled job being
    promoted, a push that gave ``expires_at``, a Sidekiq Pro job, which
    carries both fields) is left exactly as it is.
    """
    if "expiry" in payload or "expires_in" not in payload:
        return
    seconds = duration("expires_in", payload.pop("expires_in"))
    payload["expiry"] = (now if run_at is None else run_at) + seconds

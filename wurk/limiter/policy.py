"""Pure rules of the limiters: argument checks, polling pauses, reschedule delays.

Duties:
1. Check what a caller gives a limiter (name, limit, interval, lease,
   wait_timeout, reschedule cap) and refuse anything else with a
   :class:`LimiterArgumentError` that names the argument and the value.
2. :func:`poll_pause`: how long a waiting ``acquire`` sleeps before it asks
   again: the server's hint when it has one, otherwise a jittered backoff
   from 10 ms up to 250 ms, so a crowd of waiters never spins.
3. :func:`reschedule_delay`: Sidekiq Enterprise's delay for a job that hit a
   limit, ``300 * overrated + rand(300) + 1`` seconds (escalating
   five-minute steps with jitter).
4. :func:`overrated_count`: a payload's ``overrated`` counter read without
   trusting it.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from wurk.core.backoff import Backoff, Jitter
from wurk.core.validate import is_number, is_whole

NAME_PATTERN = re.compile(r"[\w\-:.#@]+", re.ASCII)
MAX_NAME = 200
MAX_LIMIT = 1_000_000_000
MAX_SECONDS = 366 * 86_400
MAX_WAIT = 86_400.0
MAX_RESCHEDULE = 10_000
DEFAULT_RESCHEDULE = 20
INTERVALS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400}
POLL_MIN = 0.01
POLL_MAX = 0.25
# Without a hint: POLL_MIN doubling to POLL_MAX, then the lower half of the
# range taken off at random, so a waiter never sleeps past POLL_MAX.
POLLS = Backoff(first=POLL_MIN, cap=POLL_MAX, jitter=Jitter.SUBTRACT, spread=0.5)


class LimiterArgumentError(ValueError):
    """A limiter was given a name, limit or duration it cannot work with."""


def check_limiter_name(name: Any) -> str:
    """Letters, digits and ``_ - : . # @``, 1 to 200 characters (the Ruby ancestor's
    pattern, so a name is also a safe Redis key suffix)."""
    if not isinstance(name, str) or not name:
        raise LimiterArgumentError(f"a limiter name must be a non-empty string, not {name!r:.60}")
    if len(name) > MAX_NAME:
        raise LimiterArgumentError(f"limiter name {name[:40]!r}... is {len(name)} characters "
                                   f"long; at most {MAX_NAME}")
    if not NAME_PATTERN.fullmatch(name):
        raise LimiterArgumentError(f"limiter name {name!r:.80} may hold only letters, digits "
                                   "and _ - : . # @")
    return name


def check_limit(value: Any, what: str = "limit") -> int:
    """A whole number from 1 to a billion (bools are refused)."""
    if not is_number(value):
        raise LimiterArgumentError(f"{what} must be a positive whole number, not {value!r:.60}")
    if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_LIMIT:
        raise LimiterArgumentError(f"{what} must be a whole number from 1 to {MAX_LIMIT}, "
                                   f"not {value!r:.60}")
    return int(value)


def check_seconds(value: Any, what: str, *, zero: bool = False,
                  most: float = MAX_SECONDS) -> float:
    """A finite number of seconds above 0 (or at least 0 with ``zero``) and at most ``most``.

    ``"second"``, ``"minute"``, ``"hour"`` and ``"day"`` stand for their
    length, as Sidekiq Enterprise's interval symbols do.
    """
    if isinstance(value, str) and value in INTERVALS:
        value = INTERVALS[value]
    if not is_number(value):
        raise LimiterArgumentError(f"{what} must be a number of seconds (or one of "
                                   f"{', '.join(INTERVALS)}), not {value!r:.60}")
    low_ok = value >= 0 if zero else value > 0
    if not math.isfinite(value) or not low_ok or value > most:
        floor = "at least 0" if zero else "above 0"
        raise LimiterArgumentError(f"{what} must be a finite number of seconds {floor} and "
                                   f"at most {most:g}, not {value!r:.60}")
    return float(value)


def check_reschedule(value: Any) -> int:
    """How many times a job may be rescheduled for this limiter; 0 turns it off."""
    if not is_whole(value) or not 0 <= value <= MAX_RESCHEDULE:
        raise LimiterArgumentError(f"reschedule must be a whole number from 0 to "
                                   f"{MAX_RESCHEDULE}, not {value!r:.60}")
    return value


def poll_pause(attempt: int, hint: float | None, rng: random.Random) -> float:
    """Seconds to sleep before check number ``attempt + 1`` (``attempt`` >= 1).

    With a hint (when the server says room appears), sleep until then plus a
    little jitter so waiters do not all wake at once; without one (a
    concurrent limiter waits for a release), back off exponentially.
    """
    if hint is not None and math.isfinite(hint):
        return max(hint, POLL_MIN) + rng.random() * POLL_MIN
    return POLLS.delay(attempt, rng)


def reschedule_delay(overrated: int, rng: random.Random) -> float:
    """Sidekiq Enterprise's default: ``300 * overrated + rand(300) + 1`` seconds."""
    return 300 * overrated + rng.randrange(300) + 1


def overrated_count(value: Any) -> int:
    """The times a payload says it was rescheduled. Anything that is not a number
    of times (a string, a bool, negative, NaN) is 0; a number past every cap
    stays past it (so the job is not rescheduled again), whatever its size."""
    if not is_number(value):
        return 0
    if (isinstance(value, float) and math.isnan(value)) or value < 0:
        return 0
    return int(min(value, MAX_RESCHEDULE + 1))


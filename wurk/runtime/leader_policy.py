"""Leader election's pure policy: its arguments, its clock and its pauses.

Duties:
1. Check a Leader's arguments (name, TTL, identity, callbacks) and say
   clearly what is wrong.
2. Name the clock beliefs are measured on, and the share of the TTL a
   belief gives up (:data:`MARGIN`).
3. Compute the pauses of a campaign: after a failed round trip
   (:func:`error_pause`) and as a follower (:func:`follower_pause`); pure
   functions of counts and times, tested without Redis or sleeping.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable

from wurk.core.backoff import Backoff, Jitter
from wurk.core.validate import is_number, is_text

MIN_TTL = 1.0
MAX_TTL = 86_400.0
NAME_MAX = 200
# is_leader() turns False this share of the TTL before the lease can expire
# in Redis: room for clock drift, and for two renewals in a row to fail
# (they come every third of the TTL) before leadership flaps.
MARGIN = 0.2
RENEW_EVERY = 1 / 3
ERROR_PAUSE_FIRST = 0.05

Callback = Callable[[], None]

if hasattr(time, "CLOCK_BOOTTIME"):
    default_clock: Callable[[], float] = functools.partial(time.clock_gettime,
                                                           time.CLOCK_BOOTTIME)
else:  # pragma: no cover - not Linux
    default_clock = time.monotonic


def check_leader_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"leader name must be a string, not {type(name).__name__}")
    if not is_text(name, NAME_MAX) or not name.isprintable() or " " in name:
        raise ValueError(f"leader name must be 1-{NAME_MAX} printable characters "
                         f"without spaces, not {name!r:.60}")
    return name


def check_ttl(ttl: object) -> float:
    if not is_number(ttl):
        raise TypeError(f"leader ttl must be a number of seconds, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(f"leader ttl must be between {MIN_TTL:g} and {MAX_TTL:g} seconds, "
                         f"not {ttl!r}")
    return float(ttl)


def check_identity(identity: object) -> str:
    if not isinstance(identity, str):
        raise TypeError(f"leader identity must be a string, not {type(identity).__name__}")
    if not is_text(identity, NAME_MAX) or not identity.isprintable():
        raise ValueError(f"leader identity must be 1-{NAME_MAX} printable characters, "
                         f"not {identity!r:.60}")
    return identity


def check_callback(callback: object, what: str) -> Callback | None:
    if callback is not None and not callable(callback):
        raise TypeError(f"{what} must be callable, not {type(callback).__name__}")
    return callback


def error_pause(failures: int, ttl: float, rng: random.Random) -> float:
    """The pause after the ``failures``-th failed round trip in a row: doubling
    from 50 ms up to a sixth of the TTL (a holder gets several tries before
    its belief lapses), jittered by a quarter either way: on average the
    planned pause, so the sixth holds."""
    policy = Backoff(first=ERROR_PAUSE_FIRST, cap=ttl / 6, jitter=Jitter.AROUND, spread=0.25)
    return policy.delay(failures, rng)


def follower_pause(left: float, ttl: float, rng: random.Random) -> float:
    """Until the holder's lease runs out (followers spread over 25 ms after
    it), and at most a third of the TTL."""
    return min(ttl * RENEW_EVERY, left + 0.005 + rng.random() * 0.02)

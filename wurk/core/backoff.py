"""Capped exponential backoff: one frozen policy for every wait after trouble.

A loop that failed (Redis away, a child crash-looping, a thread that died)
waits before it tries again, longer each time, up to a ceiling, and often
with some randomness so that many processes do not all come back at once.
Every such wait in wurk and its swarm is a :class:`Backoff` value; each
site keeps its own numbers, and this module holds the one way they are
turned into seconds. (Sidekiq's schedule for failed jobs is a wire fact, not
a backoff for trouble, and lives in :mod:`wurk.runtime.retry`.)

Duties:
1. Say what a policy is: the delay after the first failure, the growth
   factor, the cap on the grown delay, and the jitter (:class:`Jitter`, with
   a fraction ``spread``). Checked once, when the value is made.
2. Turn a failure count into seconds with :meth:`Backoff.delay`, a pure
   function: no sleeping and no I/O (the caller waits, on its own event if
   it has one), and randomness only from the ``rng`` it is given, so tests
   are deterministic. Never negative, never overflowing however many
   failures a loop counts.
3. Carry a count for loops that keep their backoff as a value, as urllib3's
   ``Retry`` does: :meth:`Backoff.increment` and :meth:`Backoff.reset`
   return new values; :meth:`Backoff.pause` is the delay for the count held.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass, replace


class Jitter(enum.Enum):
    """How the randomness moves a delay ``d`` (``s`` is the policy's spread)."""

    NONE = "none"          # exactly d
    ADD = "add"            # d to d * (1 + s): never shorter than planned
    AROUND = "around"      # d * (1 - s) to d * (1 + s): the planned delay on average
    SUBTRACT = "subtract"  # d * (1 - s) to d: never past the cap ("equal jitter" at s = 0.5)


@dataclass(frozen=True)
class Backoff:
    """Wait ``first`` after failure 1, ``factor`` times more after each next
    one, never more than ``cap`` before jitter; then jitter by ``spread``."""

    first: float
    cap: float
    factor: float = 2.0
    jitter: Jitter = Jitter.NONE
    spread: float = 0.0
    # Failures so far, for the value-style use (increment, reset, pause).
    failures: int = 0

    def __post_init__(self) -> None:
        for name in ("first", "cap", "factor", "spread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"backoff {name} must be a finite number >= 0, not {value!r}")
        if self.factor < 1:
            raise ValueError(f"backoff factor must be at least 1, not {self.factor!r}")
        if self.spread > 1:
            raise ValueError(f"backoff spread must be at most 1, not {self.spread!r}")
        if self.failures < 0:
            raise ValueError(f"backoff failures must be >= 0, not {self.failures!r}")

    def nominal(self, attempt: int) -> float:
        """The delay after failure number ``attempt`` before jitter; 0 before any failure."""
        if attempt < 1:
            return 0.0
        try:
            grown = self.first * float(self.factor) ** (attempt - 1)
        except OverflowError:  # a loop that failed for ever is at the cap
            return float(self.cap)
        return float(min(self.cap, grown))

    def span(self) -> tuple[float, float]:
        """The factors jitter multiplies a nominal delay by: (lowest, highest)."""
        if self.jitter is Jitter.ADD:
            return 1.0, 1.0 + self.spread
        if self.jitter is Jitter.AROUND:
            return 1.0 - self.spread, 1.0 + self.spread
        if self.jitter is Jitter.SUBTRACT:
            return 1.0 - self.spread, 1.0
        return 1.0, 1.0

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The shortest and longest delay after failure number ``attempt``."""
        low, high = self.span()
        nominal = self.nominal(attempt)
        return nominal * low, nominal * high

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failure number ``attempt`` (1-based).

        A jittered policy draws one ``rng.random()``; an unjittered one draws
        nothing. Without ``rng`` the draw is from the ``random`` module, which
        Python reseeds in a forked child (a ``random.Random()`` a parent made
        would give its children the same jitter)."""
        nominal = self.nominal(attempt)
        if self.jitter is Jitter.NONE or self.spread == 0 or nominal == 0:
            return nominal
        low, high = self.span()
        draw = (rng or random).random()
        return nominal * (low + (high - low) * draw)

    def increment(self) -> Backoff:
        """This policy with one more failure counted."""
        return replace(self, failures=self.failures + 1)

    def reset(self) -> Backoff:
        """This policy with no failure counted."""
        return replace(self, failures=0)

    def pause(self, rng: random.Random | None = None) -> float:
        """The delay after the failures counted so far (0 with none)."""
        return self.delay(self.failures, rng)

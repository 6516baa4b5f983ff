"""Type predicates for values from outside: arguments, settings, payloads, Redis.

Python counts a bool as an int (``True == 1``), so ``isinstance(x, int | float)``
lets ``true`` through as 1; a JSON ``true`` where a count or a number of
seconds belongs is a mistake, never 1. These predicates say what every caller
means, once. They only answer yes or no (or give the value back): each caller
keeps its own error, since users see those and the tests pin them.

Duties:
1. ``is_number``: an int or a float, not a bool.
2. ``is_whole``, ``is_count``: an int (at least 0 for a count), not a bool.
3. ``finite_float``: a number as a finite float, or None (NaN, infinity, an
   integer too big for a float).
4. ``is_text``: a non-empty string of at most so many characters.
"""

from __future__ import annotations

import math
from typing import TypeGuard


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, and not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_whole(value: object) -> TypeGuard[int]:
    """An int, and not a bool (an integral float is not whole here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: object) -> TypeGuard[int]:
    """A whole number of at least 0, not a bool."""
    return is_whole(value) and value >= 0


def finite_float(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a number or not finite."""
    if not is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def is_text(value: object, most: int) -> TypeGuard[str]:
    """A non-empty str of at most ``most`` characters."""
    return isinstance(value, str) and 0 < len(value) <= most

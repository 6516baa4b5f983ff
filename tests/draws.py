"""Random sources that draw what a test says, for jitter it checks exactly."""

from __future__ import annotations

import random


class FixedRng(random.Random):
    """A Random whose ``random()`` always returns one value."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value

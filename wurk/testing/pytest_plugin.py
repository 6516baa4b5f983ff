"""The pytest plugin wurk registers (entry point ``pytest11``): two fixtures.

``wurk_fake`` gives a test a :class:`wurk.testing.Fake` that is on for the
test's duration; ``wurk_inline`` an :class:`wurk.testing.Inline`. This
module imports nothing of wurk until a test asks for one of them, so a test
suite that never does pays nothing and sees no change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from wurk.testing import Fake, Inline


@pytest.fixture
def wurk_fake() -> Iterator[Fake]:
    """Pushes are collected in memory for this test: ``wurk_fake.jobs``, ``wurk_fake.drain()``."""
    from wurk.testing import fake  # noqa: PLC0415 - loaded only by a test that asks

    with fake() as mode:
        yield mode


@pytest.fixture
def wurk_inline() -> Iterator[Inline]:
    """Each push runs its job at once, on the test's thread, for this test."""
    from wurk.testing import inline  # noqa: PLC0415 - loaded only by a test that asks

    with inline() as mode:
        yield mode

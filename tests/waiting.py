"""Polling with a deadline, for tests that wait on another thread or process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

# Every wait's timeout is multiplied by this: scripts/test sets 2 when the
# suite runs in parallel processes, which slows every process start-up.
PATIENCE = float(os.environ.get("WURK_TEST_PATIENCE", "1"))


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02,
             what: str = "condition",
             ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """The predicate's first truthy value; AssertionError once ``timeout`` passes.

    Exceptions of the ``ignoring`` types count as a falsy value (a server
    that is failing over or restarting). The default timeout is generous on
    purpose: the suite runs in parallel processes on small CI machines, and a
    deadline here only says "eventually"; a test that means a bound passes
    its own.
    """
    timeout *= PATIENCE
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignoring:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last value {value!r})")
        time.sleep(interval)

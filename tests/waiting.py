"""Polling with a deadline, for tests that wait on another thread or process.

``wait_for`` polls a predicate; ``whole_thread_dump`` waits for one complete
SIGTTIN thread dump of a wurk process and ``wait_beats`` for more of its
heartbeats (what is running there and that it went on, not a guess from
time passed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import redis

# Every wait's timeout is multiplied by this: scripts/test sets 2 when the
# suite runs in parallel processes, which slows every process start-up.
PATIENCE = float(os.environ.get("WURK_TEST_PATIENCE", "1"))
# How long to wait for something that must happen but whose timing is not
# what the test checks (a thread to start, a process to exit): long enough for
# a machine whose cores are taken by other work.
EVENTUALLY = 20.0 * PATIENCE


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


def whole_thread_dump(ask: Callable[[], None], dumped: Callable[[], list[str]]) -> list[str]:
    """The thread names of one whole dump: ``ask`` sends SIGTTIN, ``dumped``
    lists the names of the ``thread.dump`` lines logged since before the first ask.

    A dump logs one line per thread, the oldest first (MainThread, or in a
    swarm child the thread that forked it), with no end marker: that thread's
    line in a second dump shows the first one is complete.
    """
    ask()
    first: str = wait_for(lambda: next(iter(dumped()), None), 15, what="a thread dump")
    ask()
    names: list[str] = wait_for(
        lambda: (lambda d: d if d.count(first) >= 2 else None)(dumped()), 15,
        what="a second thread dump")
    return names[:names.index(first, 1)]


def wait_beats(r: redis.Redis, identity: str, count: int = 2) -> None:
    """``count`` more heartbeats of ``identity``: the process went on running."""
    seen = [r.hget(identity, "beat")]

    def beaten() -> bool:
        beat = r.hget(identity, "beat")
        if beat != seen[-1]:
            seen.append(beat)
        return len(seen) > count

    wait_for(beaten, 15, what=f"{count} more heartbeats")

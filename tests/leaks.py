"""Processes a test left running: found, killed, and blamed on that test.

The suite shares one redis-server per pytest process, flushed before each
test, but a flush does not stop a worker that a test left alive: it goes on
fetching from the next tests' queues (most tests use a handful of queue
names) and takes their jobs, so a later, innocent test fails now and then,
far from the cause. Each test therefore runs with a mark of its own in the
environment, which every process it starts inherits (subprocess copies of
``os.environ`` keep it: the mark's name has no ``WURK_`` prefix, which the
helpers strip); at the test's end, any process still carrying that mark
after a grace period is killed and the test errors, naming it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

MARK = "TEST_LEAK_MARK"


def marked(mark: str) -> dict[int, str]:
    """Processes (not this one) whose environment carries ``mark``: pid -> command line."""
    needle = f"{MARK}={mark}".encode() + b"\0"
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read() + b"\0":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            continue
    return found


@contextlib.contextmanager
def marking(mark: str) -> Iterator[None]:
    """Every process started inside carries ``mark``; only for the block."""
    os.environ[MARK] = mark
    try:
        yield
    finally:
        os.environ.pop(MARK, None)


def survivors(mark: str, grace: float) -> dict[int, str]:
    """The marked processes still alive after ``grace`` seconds (polled, so a
    clean exit is not waited for), each then killed with SIGKILL."""
    deadline = time.monotonic() + grace
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def unmarked_env() -> dict[str, str]:
    """``os.environ`` without the mark: for a process that a module's fixture owns
    and stops, though a test asked for it to start."""
    return {k: v for k, v in os.environ.items() if k != MARK}

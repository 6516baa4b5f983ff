"""What a child's wait status says (supervisor.evidence.classify), from the
statuses of real forked processes that crashed, were killed or exited."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
from collections.abc import Callable

import pytest

from supervisor.evidence import classify, over_memory
from supervisor.exits import EX_BOOT, EX_CRASH, EX_OK
from supervisor.processes import UNKNOWN_STATUS
from wurk.runtime.reaper import NO_EVIDENCE, Evidence, crashed


def status_of(end: Callable[[], object]) -> int:
    """The wait status of a forked process that ends by ``end``."""
    pid = os.fork()
    if pid == 0:
        try:
            # pytest's fault handler would print the child's crash as if the suite's.
            faulthandler.disable()
            os.setpgid(0, 0)  # a signal aimed at it reaches nothing else
            end()
        finally:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return status


def kill_self(signum: int) -> Callable[[], object]:
    def end() -> None:
        if signum != signal.SIGKILL:  # whose handler cannot be set
            signal.signal(signum, signal.SIG_DFL)  # not Python's KeyboardInterrupt for INT
        os.kill(os.getpid(), signum)
    return end


def exit_with(code: int) -> Callable[[], object]:
    return lambda: os._exit(code)


@pytest.mark.parametrize(("end", "name"), [
    (os.abort, "SIGABRT"),
    (lambda: ctypes.string_at(0), "SIGSEGV"),
    (kill_self(signal.SIGBUS), "SIGBUS"),
    (kill_self(signal.SIGILL), "SIGILL"),
    (kill_self(signal.SIGFPE), "SIGFPE"),
])
def test_a_process_that_faults_crashed_and_the_signal_is_named(
        end: Callable[[], object], name: str) -> None:
    assert classify(status_of(end)) == crashed(f"killed by {name}")


@pytest.mark.parametrize("code", [1, 3, 2, 42, 137])
def test_an_exit_status_wurk_never_sets_is_evidence(code: int) -> None:
    cause = classify(status_of(exit_with(code)))
    assert cause.evidence is Evidence.CRASHED
    assert cause.detail == f"exited with status {code}, which wurk never sets"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT,
                                    signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1])
def test_a_kill_from_outside_is_no_evidence(signum: int) -> None:
    assert classify(status_of(kill_self(signum))) == NO_EVIDENCE


@pytest.mark.parametrize("code", [EX_OK, EX_BOOT, EX_CRASH])
def test_our_own_exit_statuses_are_no_evidence(code: int) -> None:
    assert classify(status_of(exit_with(code))) == NO_EVIDENCE


def test_a_status_someone_else_reaped_is_no_evidence() -> None:
    assert classify(UNKNOWN_STATUS) == NO_EVIDENCE


def test_a_memory_recycle_says_how_much() -> None:
    assert over_memory(600 * 1024 + 5, 512) == "recycled at 600 MB RSS, over max_memory_mb (512)"

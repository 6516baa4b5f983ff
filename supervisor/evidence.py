"""What a reaped child's wait status says about the jobs it was running.

Only the swarm parent sees a child's wait status, so only it can tell a job
that crashed its own process from a process killed from outside. Blame
needs evidence (DESIGN invariant 11), so the rule is narrow:

- Evidence: a signal the process raises against itself when its own code
  faults or gives up (:data:`CRASH_SIGNALS`: SIGSEGV from a bad pointer,
  SIGABRT from ``os.abort`` or a failed C assertion, SIGBUS, SIGILL, SIGFPE,
  SIGSYS, SIGTRAP), and an exit status that none of our code sets (a job's
  ``os._exit(3)``; see :data:`OUR_STATUSES`).
- No evidence: every other signal, SIGKILL above all (an operator, a deploy,
  the OOM killer acting on a neighbour, our own KILL of a hung or overdue
  child), SIGTERM and the like, our own exit statuses, and a status someone
  else reaped (:data:`supervisor.processes.UNKNOWN_STATUS`).

:func:`classify` is a pure function of the wait status; ``supervisor.reaped``
hands its answer to ``wurk.runtime.reaper.recover``. The memory recycle,
which the parent starts itself, is evidence too (:func:`over_memory`).
"""

from __future__ import annotations

import os
import signal

from supervisor.exits import EX_BOOT, EX_CRASH, EX_OK
from wurk.runtime.reaper import NO_EVIDENCE, Cause, crashed

CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                           signal.SIGFPE, signal.SIGSYS, signal.SIGTRAP})
# The statuses a child sets itself (supervisor.exits), and 255: what a child
# reaped by someone else is reported as, so it proves nothing either.
OUR_STATUSES = frozenset({EX_OK, EX_BOOT, EX_CRASH, 255})


def classify(wait_status: int) -> Cause:
    """The cause a wait status shows: crashed (with what), or no evidence."""
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum in CRASH_SIGNALS:
            return crashed(f"killed by {signal.Signals(signum).name}")
        return NO_EVIDENCE
    if os.WIFEXITED(wait_status):
        status = os.WEXITSTATUS(wait_status)
        if status not in OUR_STATUSES:
            return crashed(f"exited with status {status}, which wurk never sets")
    return NO_EVIDENCE


def over_memory(rss_kb: int, limit_mb: int) -> str:
    """The evidence a memory recycle holds against the jobs then running."""
    return f"recycled at {rss_kb // 1024} MB RSS, over max_memory_mb ({limit_mb})"

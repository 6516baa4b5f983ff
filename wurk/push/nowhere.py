"""Say when a push went nowhere: the first push kept for a Redis that never answered.

A push that cannot reach Redis waits in the push buffer and, if Redis stays
away until the process exits, is written to the spool
(:mod:`wurk.push.buffered`). During an outage that is what a user wants.
For a Redis that has not answered once since the process started (a typo in
``REDIS_URL``, a wrong port) it hides the mistake: the push returns a jid,
the process waits ``push_flush_timeout`` at exit, and the job lands in a
file, all in log lines an application that configured no logging never
shows. So the first such push says so through :mod:`warnings`.

Duties:
1. :class:`PushSpooledWarning` (``wurk.PushSpooledWarning``): the category a
   user filters, or turns into an error (``-W error::wurk.PushSpooledWarning``).
2. :class:`Notice`: a buffer asks :meth:`Notice.before_keeping` before it
   keeps a push whose send failed. When the pool has never had an answer and
   this process has not warned yet, it warns, naming the URL (password
   masked) and the spool file the buffer will write at exit, and returns
   that file's name for the buffer to use. Once per process, and once more
   in a forked child (its own first). As an error, the warning leaves the
   push: the buffer keeps nothing (no job is both refused and sent later),
   and the next such push warns again.
3. Point the warning at the application's line: the first frame outside
   wurk.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from wurk.core.redaction import redact_url
from wurk.push.spool import Destination, spool_name

_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
_lock = threading.Lock()
# The process that warned: a forked child is another process, and warns on its own.
_warned_in: int | None = None


class PushSpooledWarning(UserWarning):
    """A push was kept for a Redis that has never answered in this process: it
    goes to the spool at exit unless Redis answers first."""


@dataclass(frozen=True)
class Notice:
    """What a push buffer needs to say where its pushes went: the URL and the
    pool's record of answers."""

    url: str
    answered: Callable[[], bool]
    spool: Destination | None

    def before_keeping(self, jids: Sequence[str]) -> str | None:
        """Warn if this push is the process's first kept for a Redis that never
        answered; the spool file name the warning gave, else None."""
        global _warned_in  # noqa: PLW0603 - one answer per process, as the contract says
        if self.answered() or _warned_in == os.getpid():
            return None
        with _lock:
            if _warned_in == os.getpid():
                return None
            name = spool_name()
            warnings.warn(PushSpooledWarning(self._message(jids, name)),
                          stacklevel=_outside_wurk())
            _warned_in = os.getpid()  # only once warned: as an error, the next push says it too
        return name

    def _message(self, jids: Sequence[str], name: str) -> str:
        job = f"job {jids[0]}" if len(jids) == 1 else f"{len(jids)} jobs"
        if self.spool is None:
            end = "are lost if Redis stays unreachable until this process exits"
        else:
            end = (f"go to the spool file {self.spool.directory / (name + '.spool')} if "
                   "Redis stays unreachable until this process exits")
        return (f"wurk: Redis at {redact_url(self.url)} has not answered since this process "
                f"started (a wrong REDIS_URL?); the push of {job} was kept in memory, and it "
                f"and the pushes after it {end} (said once per process)")


def _outside_wurk() -> int:
    """The ``stacklevel`` of the first caller outside the wurk package."""
    frame = sys._getframe(2)  # our caller's caller: warnings.warn counts from here
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level

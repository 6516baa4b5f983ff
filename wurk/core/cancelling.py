"""Whether the job running here was cancelled: what ``wurk.cancelled()`` reads.

The worker's cancel step (``wurk.runtime.cancelling``) sets a :class:`Flag`
for every run in a context variable, so a job's own code (a thread's or an
asyncio task's) can look at it between units of work and stop cleanly,
before the :class:`~wurk.core.job_errors.JobCancelled` raised into it would
land. It sits in the core so that ``import wurk`` loads no worker for it.
"""

from __future__ import annotations

import contextvars

__all__ = ["CURRENT", "Flag", "cancelled"]


class Flag:
    """A run's cancel request, set by the process's cancel watcher.

    A worker thread keeps one for all its runs (cleared as each begins and ends); an
    asyncio run has its own. A plain attribute, not an Event: a cancel is rare,
    and setting it from another thread is one store, which a reader sees at once."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


CURRENT: contextvars.ContextVar[Flag | None] = contextvars.ContextVar("wurk_cancel",
                                                                       default=None)


def cancelled() -> bool:
    """True once a person asked to cancel the job this code runs in; False
    outside any job's run (a unit test calling the job directly)."""
    flag = CURRENT.get()
    return flag is not None and flag.is_set()

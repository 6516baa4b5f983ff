"""What a job's run can end with, raised by the worker and seen by callers.

Kept in the core, below the client and the worker both: ``import wurk``
loads no worker runtime for them, and the worker's time-limit and expiry
steps raise them without reaching into the client.
"""

from __future__ import annotations


class JobExpiredError(Exception):
    """A job was dropped unrun: it was fetched after its expiry (what a result waiter sees)."""


class JobTimeout(BaseException):
    """A job ran past its ``timeout`` (raised inside it) or its ``hard_timeout``.

    A BaseException, as asyncio's CancelledError is: library code's ``except
    Exception`` must not swallow a time limit. ``finally`` blocks still run.
    """

    def __init__(self, message: str = "job ran past its time limit", *,
                 seconds: float | None = None, hard: bool = False) -> None:
        super().__init__(message)
        self.seconds = seconds
        self.hard = hard


class JobCancelled(BaseException):
    """A person cancelled the job (``wurk cancel JID``, :func:`wurk.api.cancel`).

    Raised inside a running job at its next bytecode (a thread) or as its
    task's cancellation (asyncio); what its result waiters and its batch are
    told for a job cancelled before it ran. A BaseException, as JobTimeout,
    so ``except Exception`` in library code does not swallow it. A job may
    raise it itself to stop as cancelled (no retry, no dead entry).
    """

    def __init__(self, message: str = "cancelled by a person") -> None:
        super().__init__(message)

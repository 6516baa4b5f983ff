"""A unit of work, and what a processor needs from the fetch that handed it out.

Both fetch strategies (``wurk.runtime.fetch``, ``wurk.runtime.reliable_fetch``)
produce :class:`UnitOfWork` and implement :class:`Fetch`; the processor,
manager and failure settling (``wurk.runtime.settle``) only see these two,
and :class:`Settlement`, what a failed job's run leaves to be written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from wurk.core.threads import describe
from wurk.wire import keys


@dataclass(frozen=True, slots=True)
class UnitOfWork:
    queue: str
    raw: bytes
    # Redis's data epoch when reliable fetch claimed it ("" if unknown): how
    # a settle tells a copy lost with Redis's data from one a recovery took.
    epoch: str = ""

    def requeue_command(self) -> tuple[Any, ...]:
        return ("RPUSH", keys.queue(self.queue), self.raw)


# Runs a callable somewhere else (a bookkeeping thread): how a caller that
# must not wait on Redis (the event loop) lets an acknowledgement be sent.
Sender = Callable[[Callable[[], None]], object]


class Fetch(Protocol):
    """What processors need from a fetch strategy (basic or reliable)."""

    def start(self) -> None: ...
    def quiet(self) -> None: ...
    def stop(self) -> None: ...
    def fetch(self) -> UnitOfWork | None: ...
    def acknowledge(self, work: UnitOfWork, jid: str | None = None,
                    send: Sender | None = None) -> None: ...
    def settle(self, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool: ...
    def requeue(self, works: Iterable[UnitOfWork]) -> int: ...


# Why a payload went to dead as it was found: (error_class, error_message).
Reason = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Settlement:
    outcome: str  # "retry", "dead", "schedule" (over a limit) or "dropped"
    entry: str | bytes = ""
    at: float = 0.0  # the retry time, or the moment of death
    # Set for an entry kept as the raw bytes: the note written beside it
    # (``wurk.wire.dead_notes``), since the bytes themselves may not change.
    reason: Reason | None = None

    @classmethod
    def dead(cls, entry: str | bytes, now: float | None = None,
             reason: Reason | None = None) -> Settlement:
        return cls("dead", entry, time.time() if now is None else now, reason)

    @classmethod
    def unrecordable(cls, raw: bytes, exc: BaseException) -> Settlement:
        """The payload as fetched, to dead, when its failure cannot be written."""
        return cls.dead(raw, reason=(type(exc).__name__,
                                     f"wurk could not record its failure ({describe(exc)})"))

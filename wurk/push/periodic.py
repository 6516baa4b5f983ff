"""Periodic entries: which job runs on which cron schedule, declared in code or topology.

Duties:
1. :func:`make_entry` checks one declaration (schedule and zone through
   :mod:`wurk.push.cron`, the job's name, JSON ``args``, queue, retry,
   ``missed``, the entry's name) and raises a :class:`PeriodicError` that
   names the entry and the bad value.
2. :class:`PeriodicTable`: the process-wide table ``wurk.periodic(...)``
   adds to (like the job registry). Declaring the same entry twice is a
   no-op; a different entry under a taken name is refused.
3. An entry gives the payload each of its ticks pushes (``tick_payload``:
   class, args, queue, retry and the tick's id in ``periodic``) and the
   fields Redis keeps about it (Sidekiq Enterprise's ``loops:{lid}`` hash).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wurk.core.validate import is_count, is_text
from wurk.push.cron import CronError, Schedule
from wurk.wire.payload import check_args

MISSED = ("once", "skip")
NAME = re.compile(r"[^\s]{1,200}")


class PeriodicError(ValueError):
    """A periodic entry that cannot be used; the message names it and the bad value."""


@dataclass(frozen=True)
class PeriodicEntry:
    name: str
    schedule: Schedule
    job: str
    args: tuple[Any, ...] = ()
    queue: str = "default"
    retry: bool | int = True
    # After downtime: "once" enqueues the latest missed tick, "skip" none.
    missed: str = "once"
    # The pause state an entry starts with; later pauses live in Redis.
    paused: bool = False

    def tick_payload(self, tick: int) -> dict[str, Any]:
        """What one tick pushes; ``periodic`` is the tick's id (entry, UTC epoch)."""
        return {"class": self.job, "args": list(self.args), "queue": self.queue,
                "retry": self.retry, "periodic": {"name": self.name, "tick": tick}}

    def loop_fields(self) -> dict[str, str]:
        """The ``loops:{name}`` hash fields this declaration owns."""
        options = {"queue": self.queue, "retry": self.retry, "args": list(self.args),
                   "missed": self.missed}
        return {"schedule": self.schedule.expr, "klass": self.job, "tz": self.schedule.tz,
                "options": json.dumps(options, separators=(",", ":"))}


def _job_name(job: Any) -> tuple[str, str | None, bool | int | None]:
    """(wire name, its queue, its retry) for a job function, Job class or name."""
    if isinstance(job, str):
        return job, None, None
    name = getattr(job, "wurk_name", None) or getattr(job, "name", None)
    options = getattr(job, "wurk_options", None) or getattr(job, "options", None)
    if not isinstance(name, str) or not name:
        raise PeriodicError(f"job must be a job name, an @wurk.job function or a wurk.Job "
                            f"class, got {job!r}")
    return name, getattr(options, "queue", None), getattr(options, "retry", None)


def make_entry(schedule: str, job: Any, *, args: Sequence[Any] = (), tz: str = "UTC",
               name: str | None = None, queue: str | None = None,
               retry: bool | int | None = None, missed: str = "once",
               paused: bool = False) -> PeriodicEntry:
    """Check one declaration; a PeriodicError names the entry and what is wrong."""
    job_name, job_queue, job_retry = _job_name(job)
    if not job_name:
        raise PeriodicError("periodic job name must be a non-empty string")
    label = name if name is not None else job_name
    where = f"periodic entry {label!r}"
    if not isinstance(label, str) or not NAME.fullmatch(label) or not label.isprintable():
        raise PeriodicError(f"{where}: name must be 1-200 printable characters without "
                            f"spaces")
    try:
        when = Schedule(schedule, tz)
    except CronError as exc:
        raise PeriodicError(f"{where}: {exc}") from None
    return PeriodicEntry(label, when, job_name, _checked_args(where, args),
                         _checked_queue(where, _first(queue, job_queue, "default")),
                         _checked_retry(where, _first(retry, job_retry, True)),
                         _checked_missed(where, missed), _checked_flag(where, paused))


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _checked_args(where: str, args: Any) -> tuple[Any, ...]:
    if not isinstance(args, list | tuple):
        raise PeriodicError(f"{where}: args must be a list, got {type(args).__name__}")
    try:
        check_args(list(args))
    except (TypeError, ValueError) as exc:
        raise PeriodicError(f"{where}: args must be JSON: {exc}") from None
    return tuple(args)


def _checked_queue(where: str, queue: Any) -> str:
    if not is_text(queue, 200):
        raise PeriodicError(f"{where}: queue must be a non-empty string, got {queue!r}")
    return queue


def _checked_retry(where: str, retry: Any) -> bool | int:
    if not (isinstance(retry, bool) or is_count(retry)):
        raise PeriodicError(f"{where}: retry must be true, false or a non-negative int, "
                            f"got {retry!r}")
    return bool(retry) if isinstance(retry, bool) else int(retry)


def _checked_missed(where: str, missed: Any) -> str:
    if missed not in MISSED:
        raise PeriodicError(f"{where}: missed must be 'once' or 'skip', got {missed!r}")
    return str(missed)


def _checked_flag(where: str, paused: Any) -> bool:
    if not isinstance(paused, bool):
        raise PeriodicError(f"{where}: paused must be true or false, got {paused!r}")
    return paused


class PeriodicTable:
    """Entry name -> entry. Thread-safe; one default instance per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, PeriodicEntry] = {}

    def add(self, entry: PeriodicEntry) -> PeriodicEntry:
        with self._lock:
            existing = self._entries.get(entry.name)
            if existing is not None and existing != entry:
                raise PeriodicError(f"periodic entry {entry.name!r} is already declared "
                                    f"differently; give one of them another name=")
            self._entries[entry.name] = entry
        return entry

    def entries(self) -> list[PeriodicEntry]:
        with self._lock:
            return list(self._entries.values())

    def discard(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


table = PeriodicTable()


def periodic(schedule: str, job: Any, *, args: Sequence[Any] = (), tz: str = "UTC",
             name: str | None = None, queue: str | None = None,
             retry: bool | int | None = None, missed: str = "once",
             paused: bool = False) -> PeriodicEntry:
    """Run ``job`` on a cron ``schedule`` (in zone ``tz``), once per tick cluster-wide.

    ``wurk.periodic("*/5 * * * *", report, args=["daily"], tz="Europe/Paris")``.
    The entry's name defaults to the job's; ``missed`` says what a tick
    missed during downtime does ("once": the latest runs once; "skip").
    """
    return table.add(make_entry(schedule, job, args=args, tz=tz, name=name, queue=queue,
                                retry=retry, missed=missed, paused=paused))


def merged(*groups: Sequence[PeriodicEntry]) -> list[PeriodicEntry]:
    """Entries of several sources (code, topology) as one list; a name declared
    twice must be the same entry."""
    combined = PeriodicTable()
    for group in groups:
        for entry in group:
            combined.add(entry)
    return combined.entries()

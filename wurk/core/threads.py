"""Thread supervision: a process's long-lived threads, kept running and accounted for.

Duties:
1. ``start(role, loop, stopped=...)`` runs ``loop`` on a daemon thread. A
   loop that returns has ended as it should; one that raises anything (a
   SystemExit or a RecursionError out of library code included) has died.
2. A death is logged as ``thread.died`` with the role and the error, and the
   loop is started again on the same thread after a pause (``thread.replaced``).
   The pause (a :class:`~wurk.core.backoff.Backoff`) doubles from
   :data:`RESTART_PAUSE` up to :data:`RESTART_PAUSE_MAX` while a loop keeps
   dying soon after each restart. A loop whose owner already asked it to stop
   (``stopped()``) is not restarted.
3. ``dead()`` names the roles whose loop is down: from a death until its
   replacement, or for good when even the supervision failed (a thread that
   ended while registered and not stopped). ``/live`` answers 503 while any
   is down and reports the deaths and replacements so far (``report()``).
4. One registry per process; a forked child starts with an empty one, since
   none of the parent's threads exist there.

Each loop still guards its own iterations (catch, log, back off, carry on);
this is the net under those guards, and it costs a job nothing.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wurk.core.backoff import Backoff
from wurk.core.logging import get_logger

log = get_logger("wurk.threads")
RESTART_PAUSE = 1.0
RESTART_PAUSE_MAX = 30.0
# A loop that ran this long before dying starts again after the shortest pause.
STABLE_RUN = 60.0
# How often a restart pause looks at ``stopped()``.
STOP_POLL = 0.05


def describe(exc: BaseException) -> str:
    """An error as log lines carry it: its type and message. Never raises,
    though an exception's ``__str__`` may (a log line must not become the crash)."""
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001
        message = "(its message raised an error)"
    return f"{type(exc).__name__}: {message}"


def _never() -> bool:
    return False


@dataclass(eq=False)
class _Entry:
    role: str
    loop: Callable[[], None]
    stopped: Callable[[], bool]
    # Counts the deaths in a row that came soon after a restart.
    backoff: Backoff
    thread: threading.Thread = field(init=False)
    down: bool = False


class ThreadSupervisor:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Replaced, never taken, after a fork: another thread may have held it.
        self._lock = threading.Lock()
        self._entries: set[_Entry] = set()
        self.deaths: collections.Counter[str] = collections.Counter()
        self.replaced: collections.Counter[str] = collections.Counter()
        self.last_death: dict[str, str] | None = None

    def start(self, role: str, loop: Callable[[], None], *,
              stopped: Callable[[], bool] = _never, name: str | None = None) -> threading.Thread:
        """Run ``loop`` on a new daemon thread under supervision; returns the thread."""
        entry = _Entry(role, loop, stopped, Backoff(first=RESTART_PAUSE, cap=RESTART_PAUSE_MAX))
        entry.thread = threading.Thread(target=self._run, args=(entry,),
                                        name=name or f"wurk-{role}", daemon=True)
        with self._lock:
            self._entries.add(entry)
        entry.thread.start()
        return entry.thread

    def _run(self, entry: _Entry) -> None:
        while True:
            began = time.monotonic()
            try:
                entry.loop()
            except BaseException as exc:  # noqa: BLE001 - a dead loop is reported and restarted
                self._died(entry, exc, time.monotonic() - began)
            else:
                break
            if not self._wait_to_restart(entry):
                break
            self._restarted(entry)
        with self._lock:
            self._entries.discard(entry)

    def _died(self, entry: _Entry, exc: BaseException, ran: float) -> None:
        entry.backoff = (entry.backoff.reset() if ran >= STABLE_RUN else entry.backoff).increment()
        with self._lock:
            entry.down = True
            self.deaths[entry.role] += 1
            self.last_death = {"role": entry.role, "thread": entry.thread.name,
                               "error": describe(exc)}
        log.error("thread.died", role=entry.role, thread=entry.thread.name, error=describe(exc),
                  restart_in=None if entry.stopped() else entry.backoff.pause())

    def _wait_to_restart(self, entry: _Entry) -> bool:
        """Sleep the restart pause; False when the owner asked the loop to stop meanwhile."""
        deadline = time.monotonic() + entry.backoff.pause()
        while not entry.stopped():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(STOP_POLL, left))
        return False

    def _restarted(self, entry: _Entry) -> None:
        with self._lock:
            entry.down = False
            self.replaced[entry.role] += 1
        log.warning("thread.replaced", role=entry.role, thread=entry.thread.name)

    def dead(self) -> list[str]:
        """Roles with a loop down right now (sorted, each once)."""
        with self._lock:
            entries = list(self._entries)
        return sorted({e.role for e in entries if e.down or _ended(e)})

    def report(self) -> dict[str, Any]:
        """For ``/live``: what is down now, and deaths and replacements per role so far."""
        dead = self.dead()
        with self._lock:
            return {"dead": dead, "deaths": dict(self.deaths), "replaced": dict(self.replaced),
                    "last_death": self.last_death}


def _ended(entry: _Entry) -> bool:
    """Gone while still registered and not asked to stop: the supervision itself failed."""
    thread = entry.thread
    return thread.ident is not None and not thread.is_alive() and not entry.stopped()


_process = ThreadSupervisor()


def start(role: str, loop: Callable[[], None], *, stopped: Callable[[], bool] = _never,
          name: str | None = None) -> threading.Thread:
    """Start a supervised thread in this process (see :meth:`ThreadSupervisor.start`)."""
    return _process.start(role, loop, stopped=stopped, name=name)


def dead() -> list[str]:
    return _process.dead()


def report() -> dict[str, Any]:
    return _process.report()


def forget_after_fork() -> None:
    """In a forked child: the parent's threads did not come along."""
    _process._reset()

"""Background services: one long-lived loop on a named, supervised daemon thread.

Most of a process's background work has the same shape: do one step, pause,
do it again until asked to stop, and never let an error end the thread. This
module writes that shape once; each component (the heartbeat, the scheduler,
the reaper ...) composes a :class:`Service` with its own step.

Duties:
1. ``start()`` runs the loop on a daemon thread under :mod:`wurk.core.threads`
   (role and thread name as given), once: a second start is a no-op, and so
   is a start after ``stop``, which is terminal.
2. The loop: wait ``first_pause``, then call ``step()`` and wait the pause it
   returns, until stopped; ``None`` waits until ``wake()`` or ``stop()``.
   A step that raises anything (SystemExit out of library code included) is
   handed to ``failed(exc, failures)``, which logs it and returns the pause
   before the next try; ``failures`` counts the failed steps in a row and
   resets at the first step that returns. ``finish()``, if given, runs on the
   thread once the loop has ended.
3. ``wait(seconds)`` is the loop's pause, usable by the step itself: it ends
   early on ``stop()`` (True then) or on ``wake()`` (a state change the
   owner wants acted on now), and at once when either already happened.
4. ``stop(timeout)``: ask the loop to end and wake it; join the thread for up
   to ``timeout`` seconds (never when called from the loop's own thread,
   which may stop itself that way). True when the thread is gone.

A forked child has none of the parent's threads: an owner whose service can
outlive a fork builds a new one in the child (its lock may have been held).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from wurk.core import threads
from wurk.core.threads import describe

if TYPE_CHECKING:
    from wurk.core.logging import Logger

Step = Callable[[], float | None]
Failed = Callable[[BaseException, int], float | None]


def logged(log: Logger, event: str, pause: float | Callable[[], float]) -> Failed:
    """The usual ``failed``: log ``event`` with the error, then pause ``pause`` seconds."""
    def failed(exc: BaseException, failures: int) -> float:
        log.error(event, error=describe(exc))
        return pause() if callable(pause) else pause
    return failed


class Service:
    """One step-and-pause loop on a supervised thread; see the module docstring."""

    def __init__(self, role: str, step: Step, *, failed: Failed,
                 name: str | None = None,
                 first_pause: float | Callable[[], float | None] | None = 0.0,
                 finish: Callable[[], None] | None = None) -> None:
        self.role = role
        self.name = name
        self._step = step
        self._failed = failed
        self._first_pause = first_pause
        self._finish = finish
        # The plain lock is what ``with`` takes: its C-level enter and exit cannot be
        # left half done by an async exception (a job's JobTimeout) as a
        # Condition's Python-level ones could.
        self._lock = threading.Lock()
        self._signal = threading.Condition(self._lock)
        self._stopping = False
        self._woken = False
        self.failures = 0
        self.thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """True once ``stop`` was called."""
        return self._stopping

    def start(self) -> bool:
        """Start the thread; False when it was started (or stopped) before."""
        with self._lock:
            if self.thread is not None or self._stopping:
                return False
            self.thread = threads.start(self.role, self._loop, stopped=lambda: self._stopping,
                                        name=self.name)
        return True

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the loop to end; wait up to ``timeout`` seconds (None: not at all) for it.
        True when its thread has ended (or never started)."""
        with self._lock:
            self._stopping = True
            self._signal.notify_all()
        thread = self.thread
        if thread is None:
            return True
        if timeout is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    def wake(self) -> None:
        """End the current (or next) pause now, without stopping."""
        with self._lock:
            self._woken = True
            self._signal.notify_all()

    def wait(self, seconds: float | None) -> bool:
        """Pause up to ``seconds`` (None: until woken); True when stopping."""
        with self._lock:
            if not (self._stopping or self._woken):
                self._signal.wait(seconds)
            self._woken = False
            return self._stopping

    def alive(self) -> bool:
        thread = self.thread
        return thread is not None and thread.is_alive()

    def _loop(self) -> None:
        first = self._first_pause() if callable(self._first_pause) else self._first_pause
        stopped = self.wait(first)
        while not stopped:
            try:
                pause = self._step()
                self.failures = 0
            except BaseException as exc:  # noqa: BLE001 - the loop outlives any one step
                self.failures += 1
                pause = self._failed(exc, self.failures)
            stopped = self.wait(pause)
        if self._finish is not None:
            self._finish()

"""The job timer: one thread per process that enforces soft and hard time limits.

Duties:
1. :meth:`JobTimer.run` runs one job under its limits. Arming costs a heap
   push under a lock; the thread starts with the first bounded job, so a
   process whose jobs have no limits runs no timer at all.
2. Soft limit (``timeout``): at the deadline the timer raises
   :class:`~wurk.runtime.time_limits.JobTimeout` inside the job's thread
   with ``PyThreadState_SetAsyncExc``, once per run. CPython delivers it
   between bytecodes, so a job blocked in one long C call (``time.sleep``,
   a socket read) sees it only when that call returns. A thread waiting on
   an ``async def`` job gets no async exception: the job's task is
   cancelled and the wait raises the JobTimeout (``wurk.runtime.event_loop``).
3. Never into the next job: the timer fires at most once per run, and only
   under its lock while the run is not done; the job thread ends a run by
   marking it done under that lock and, if the timer had fired, taking
   delivery of a JobTimeout still pending and dropping it. One that lands
   between the job's end and that point is caught in :meth:`JobTimer.run`
   itself and becomes the run's failure (the job did run past its limit); it never reaches the
   processor's own code after. The job thread takes only the plain lock,
   whose ``with`` is C code: a JobTimeout landing inside a Python-level
   ``__enter__``/``__exit__`` (a Condition's) could leave that held.
4. Hard limit (``hard_timeout``): the timer takes the job from the in-flight
   table (so the processor drops whatever outcome the job comes back with),
   has the job's lifecycle settle it as failed with a JobTimeout
   (``overran``: its steps' writes, then the atomic settle, retry or dead
   as usual), raises JobTimeout in its thread to unwind it
   if it can, and calls ``on_overrun`` (the launcher's recycle request: a
   graceful stop that hands the other running jobs back).
5. Tell a swarm parent (``notes``) when a hard-limited job starts and ends,
   so the parent can KILL a child too wedged to do step 4 itself and settle
   the job as a timeout failure (``supervisor.overrun``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.runtime import event_loop
from wurk.runtime.time_limits import JobTimeout, Limits
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.runtime.inflight import InFlightTable
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.job_timer")
# The settle of an overrun run: (work, failure, stop waiter) -> settled.
Overran = Callable[["UnitOfWork", BaseException, Callable[[float], bool]], bool]
Notes = Callable[[bytes], None]
_PENDING: Any = object()


@dataclass(eq=False)
class Run:
    """One bounded run: which thread, which job, and how far the timer got with it."""

    tid: int
    slot: str
    work: UnitOfWork
    jid: str | None
    options: JobOptions | None
    limits: Limits
    started: float = field(default_factory=time.monotonic)
    fired: bool = False     # a JobTimeout was sent to the thread (at most once)
    done: bool = False      # the job thread ended the run; the timer leaves it alone
    reported: bool = False  # the parent was told about its hard deadline
    # A job running as a task of the asyncio executor (``wurk.runtime.task_limits``):
    # its hard limit cancels the task on its loop and leaves the JobTimeout here.
    task: asyncio.Task[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    timeouts: list[JobTimeout] = field(default_factory=list)


def raise_in(tid: int, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in thread ``tid`` at its next function call or loop jump."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(exc_type))


def _landing() -> None:
    """An empty Python call: entering it is a point where a pending async exception lands."""


def _absorb_pending() -> None:
    """Take delivery of a JobTimeout sent to this thread and not yet raised, and drop it.

    Never cleared with ``PyThreadState_SetAsyncExc(tid, NULL)``: on CPython
    3.11 that leaves the interpreter-wide "async exception pending" flag set
    with nothing to deliver, so every thread then stops at every call and
    loop jump for good, and profiled or GIL-contended code crawls to a halt.
    Letting the exception land and catching it resets the flag.
    """
    with contextlib.suppress(JobTimeout):
        _landing()


def timeout_type(message: str, seconds: float, hard: bool) -> type[JobTimeout]:
    """A JobTimeout subclass that carries its message (the async raise passes no args)."""
    def init(self: JobTimeout) -> None:
        JobTimeout.__init__(self, message, seconds=seconds, hard=hard)
    return type("JobTimeout", (JobTimeout,), {"__init__": init, "__module__": "wurk"})


class JobTimer:
    def __init__(self, in_flight: InFlightTable, overran: Overran) -> None:
        self.in_flight = in_flight
        # Settles a run this timer took at its hard limit (the job's lifecycle does).
        self.overran = overran
        self.on_overrun: Callable[[], None] | None = None
        self._notes: Notes | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, bool, Run]] = []
        self._seq = itertools.count()
        self._active: set[Run] = set()
        self.service = Service("job-timer", self._step, name="wurk-job-timer",
                               failed=logged(log, "job_timer.error", 0.05))

    # -- the job thread's side ----------------------------------------------
    def run(self, slot: str, work: UnitOfWork, job: dict[str, Any], options: JobOptions | None,
            *, limits: Limits, call: Callable[[], BaseException | None]) -> BaseException | None:
        """``call()`` (which returns the job's failure or None) under ``limits``."""
        jid = job.get("jid") if isinstance(job.get("jid"), str) else None
        run = Run(threading.get_ident(), slot, work, jid, options, limits)
        outcome = _PENDING
        try:
            try:
                self._arm(run)
                outcome = call()
            finally:
                self._end(run)
        except JobTimeout as late:
            # Delivered as the run ended, after the job's own code had let go
            # of it: still the run's failure, never the processor's.
            self._end(run)
            return late if outcome is _PENDING else outcome
        return outcome

    def arm_task(self, run: Run, task: asyncio.Task[Any],
                 loop: asyncio.AbstractEventLoop) -> None:
        """Keep a task's hard limit (its loop keeps the soft one): a coroutine
        stuck in sync code holds the loop, and is still settled on time."""
        run.task, run.loop = task, loop
        self._arm(run)

    def end_task(self, run: Run) -> None:
        """The task's run is over: from now on its hard limit cannot fire."""
        with self._lock:
            if run.done:
                return  # the timer took it: the end was said then
            run.done = True
            self._active.discard(run)
        if run.reported:
            self._note(b"-" + dumps([run.jid]).encode() + b"\n")

    def _arm(self, run: Run) -> None:
        now = run.started
        # The plain lock (a C-level with) on the job thread's side: a JobTimeout
        # landing in a Python-level __enter__/__exit__ could leave it held.
        with self._lock:
            self._compact()
            head = self._heap[0][0] if self._heap else None
            if run.limits.timeout is not None and run.task is None:
                heapq.heappush(self._heap, (now + run.limits.timeout, next(self._seq), False, run))
            if run.limits.hard_timeout is not None:
                heapq.heappush(self._heap, (now + run.limits.hard_timeout, next(self._seq),
                                            True, run))
            self._active.add(run)
            # The timer sleeps until the earliest deadline: wake it only if that moved.
            if head is None or self._heap[0][0] < head:
                self._cond.notify()
            if self.service.thread is None:  # once: wurk.core.threads restarts it if it dies
                self.service.start()
        if run.limits.hard_timeout is not None:
            self._note_start(run)

    def _end(self, run: Run) -> None:
        with self._lock:
            run.done = True
            self._active.discard(run)
            fired = run.fired
        if fired:
            _absorb_pending()
        if run.reported:
            self._note(b"-" + dumps([run.jid]).encode() + b"\n")

    # -- the timer thread -----------------------------------------------------
    def stop(self) -> None:
        self.service.stop()
        with self._cond:
            self._cond.notify()

    def _step(self) -> float:
        """Fire the next deadline due; one that raises is logged and retried after a
        short pause (no spin if the same entry keeps failing)."""
        overran = self._next_due()
        if overran is not None:
            self._overran(overran)
            if overran.loop is not None and overran.task is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the task went with it
                    overran.loop.call_soon_threadsafe(overran.task.cancel)
                if overran.reported:
                    self._note(b"-" + dumps([overran.jid]).encode() + b"\n")
        return 0.0

    def _next_due(self) -> Run | None:
        """Wait for the next deadline and fire it (under the lock); a run past its hard
        limit is returned for :meth:`_overran`."""
        with self._cond:
            if not self._heap:
                self._cond.wait(1.0)
                return None
            when, _, hard, run = self._heap[0]
            wait = when - time.monotonic()
            if wait > 0:
                self._cond.wait(wait)
                return None
            heapq.heappop(self._heap)
            self._compact()
            if run.done:
                return None
            self._fire(run, hard)
            return run if hard else None

    def _fire(self, run: Run, hard: bool) -> None:
        """Raise JobTimeout in the run's thread, once; the lock is held, so not after ``_end``."""
        if run.fired or run.done:
            return
        run.fired = True
        seconds = (run.limits.hard_timeout if hard else run.limits.timeout) or 0.0
        kind = "hard_timeout" if hard else "timeout"
        if run.task is not None:  # a task's only deadline here is its hard one
            run.done = True  # its own end now changes nothing
            self._active.discard(run)
            run.timeouts.append(JobTimeout(f"job ran past its {kind} of {seconds:g}s",
                                           seconds=seconds, hard=True))
            return
        timeout = timeout_type(f"job ran past its {kind} of {seconds:g}s", seconds, hard)
        if not event_loop.cancel(run.tid, timeout):  # an async job's task is cancelled instead
            raise_in(run.tid, timeout)
        if not hard:
            log.warning("job.timeout", jid=run.jid, queue=run.work.queue, timeout=seconds)

    def _compact(self) -> None:
        # Runs that ended leave their entries behind (long limits, short jobs):
        # rebuilt once they outnumber live runs 8 to 1, so the cost stays O(1) a job.
        if len(self._heap) > 64 and len(self._heap) > 8 * len(self._active):
            self._heap = [e for e in self._heap if not e[3].done]
            heapq.heapify(self._heap)

    # -- hard limit -------------------------------------------------------------
    def _overran(self, run: Run) -> None:
        running = self.in_flight.take_over(run.slot, run.work)
        if running is None:
            return  # it ended, or a stop took it, as the limit passed
        seconds = run.limits.hard_timeout or 0.0
        log.error("job.hard_timeout", jid=run.jid, queue=run.work.queue, hard_timeout=seconds,
                  elapsed=round(time.monotonic() - run.started, 3))
        failure = JobTimeout(f"job ran past its hard_timeout of {seconds:g}s", seconds=seconds,
                             hard=True)
        threading.Thread(target=self._settle_overrun, args=(run, failure),
                         name="wurk-hard-timeout", daemon=True).start()

    def _settle_overrun(self, run: Run, failure: JobTimeout) -> None:
        try:
            if self.overran(run.work, failure, self.service.wait):
                self._note(b"-" + dumps([run.jid]).encode() + b"\n")
        except BaseException as exc:  # noqa: BLE001 - the copy stays in the private list
            log.error("job_timer.error", jid=run.jid, error=threads.describe(exc))
        finally:
            if self.on_overrun is not None:
                self.on_overrun()

    # -- the swarm parent -------------------------------------------------------
    def report_to(self, notes: Notes) -> None:
        """Send hard deadlines to a swarm parent from now on, those already armed first."""
        self._notes = notes
        with self._cond:
            armed = [r for r in self._active if r.limits.hard_timeout is not None]
        for run in armed:
            self._note_start(run)

    def _note_start(self, run: Run) -> None:
        if self._notes is None or run.jid is None or run.limits.hard_timeout is None:
            return
        run.reported = True
        at = run.started + run.limits.hard_timeout
        self._note(b"+" + dumps([run.jid, run.work.queue, at]).encode() + b"\n")

    def _note(self, line: bytes) -> None:
        if self._notes is not None:
            self._notes(line)


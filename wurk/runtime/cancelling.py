"""Cancel a running job from any host: the cancel step and the watch that serves it.

A person's cancel (``wurk.api.cancel``) leaves a marker, ``wurk:cancel:<jid>``,
in Redis; no signal crosses a host. The process running that jid finds it
within :data:`POLL` seconds and stops the job.

Duties:
1. :class:`CancelStep`, a step of every job: around its run it records
   which thread or task runs which jid. A worker thread has one
   :class:`Lane`, made at its first run and reused by every later one, so a
   threaded run allocates nothing for cancel; an asyncio run has a
   :class:`Target`. Each carries the :class:`~wurk.core.cancelling.Flag` in
   ``wurk.core.cancelling.CURRENT`` that ``wurk.cancelled()`` and a class
   job's ``self.cancelled`` read.
2. :meth:`CancelStep.cancel`: set the flag, then raise
   :class:`~wurk.core.job_errors.JobCancelled` in the job's thread at its next
   bytecode (as the job timer raises JobTimeout: ``job_timer.raise_in``), or
   cancel the task the thread waits on (``event_loop.cancel``), or, for a
   native asyncio job, its own task (its CancelledError is turned into
   JobCancelled here, unless a stop took the job). Once per run, and never
   into the next job: a lane's run ends under the lock the cancel fires
   under, and a JobCancelled still pending at the end is taken and
   dropped (or becomes the run's failure: it did run until cancelled); a
   task's cancel is made on its loop, where the run's end is marked. The
   lifecycle settles a JobCancelled as the "cancelled" ending
   (``wurk.runtime.lifecycle``).
3. :class:`CancelWatch`: a thread that, while the process runs any job,
   reads the markers of the jids it runs (one MGET each :data:`POLL`
   seconds), cancels those found, and deletes the markers it served (a
   later job pushed with the same jid runs). A marker of "kill" also calls
   ``on_kill`` with the jid (the launcher's: the manager settles the job
   as cancelled now, taking it as the job timer takes a job past its hard
   limit, and the process recycles, as at a hard timeout), also for a run
   a plain cancel fired into before: one stuck in C, never reached by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from wurk.core.cancelling import CURRENT, Flag
from wurk.core.job_errors import JobCancelled
from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.runtime import event_loop
from wurk.runtime.job_timer import raise_in
from wurk.runtime.lifecycle.step import AsyncCall, Call, Run, Step
from wurk.wire import keys
from wurk.wire.lua import UNIQUE_RELEASE  # compare-and-delete: for markers here too

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.cancel")
# Seconds between two reads of the markers: the bound on how long a cancel takes.
POLL = 1.0
_PENDING: Any = object()


@dataclass(eq=False, slots=True)
class Target:
    """One asyncio task's run that may be cancelled, and how far its cancel got."""

    jid: str
    slot: str
    work: UnitOfWork
    task: asyncio.Task[Any] | None
    loop: asyncio.AbstractEventLoop
    flag: Flag = field(default_factory=Flag)
    fired: bool = False
    # Set on the task's loop as the run ends: a cancel that gets there later is dropped.
    done: bool = False


@dataclass(eq=False, slots=True)
class Lane:
    """A worker thread's runs, one at a time: made at its first run and reused,
    so a run on a thread allocates nothing for its cancel.

    ``jid`` is set while a run is on the lane and None between runs. A run's
    end and a cancel's firing take ``lock``, so a cancel fires into the run it
    was meant for or into none; a begin needs no lock, as it comes after an
    end, and it sets ``jid`` last, so a watch that sees the new jid sees the
    new run's ``fired`` too."""

    tid: int
    flag: Flag = field(default_factory=Flag)
    jid: str | None = None
    slot: str = ""
    work: UnitOfWork | None = None
    fired: bool = False
    # The plain lock: a JobCancelled landing in a Python-level __exit__ could leave it held.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, run: Run, jid: str) -> None:
        self.fired = False
        self.flag.clear()
        self.slot, self.work = run.slot, run.work
        self.jid = jid

    def end(self) -> None:
        """The run is over: no cancel fires into this lane until the next begins;
        a JobCancelled fired before and still pending lands here, and is dropped."""
        with self.lock:
            if self.jid is None:
                return
            self.jid = self.work = None
            fired = self.fired
            # The flag stays the thread's CURRENT between runs: what the thread
            # runs next outside a run (one without a jid) must read no cancel.
            # A store, not a call: no bytecode here where a pending
            # JobCancelled could land, or the GIL pass, with the lock held.
            self.flag._set = False
        if fired:
            with contextlib.suppress(JobCancelled):
                _landing()


def _landing() -> None:
    """An empty Python call: where a pending async exception lands."""


class CancelStep(Step):
    name = "cancel"
    every_job = True

    def __init__(self) -> None:
        # Threads' lanes by thread id, and asyncio runs by their target's id;
        # the watch reads copies (a dict store and pop are each atomic).
        self._lanes: dict[int, Lane] = {}
        self._tasks: dict[int, Target] = {}

    # -- the job's side ---------------------------------------------------------
    def around(self, run: Run, call: Call) -> Call:
        if run.jid is None:
            return call
        return partial(self._on_lane, run, call)

    def _on_lane(self, run: Run, call: Call) -> Any:
        tid = threading.get_ident()
        lane = self._lanes.get(tid)
        if lane is None or lane.tid != tid:
            lane = self._lanes[tid] = Lane(tid)
        if CURRENT.get() is not lane.flag:
            CURRENT.set(lane.flag)  # once per thread: its runs share the lane's flag
        outcome = _PENDING
        try:
            try:
                lane.begin(run, run.jid)  # type: ignore[arg-type]  # around checked it
                outcome = call()
            finally:
                lane.end()
        except JobCancelled as late:
            # Delivered as the run ended: still the run's failure, never ours.
            lane.end()
            return late if outcome is _PENDING else outcome
        return outcome

    def around_async(self, run: Run, call: AsyncCall) -> AsyncCall:
        jid = run.jid
        if jid is None:
            return call

        async def cancellable() -> Any:
            task = asyncio.current_task()
            target = Target(jid, run.slot, run.work, task, asyncio.get_running_loop())
            token = CURRENT.set(target.flag)
            key = id(target)
            self._tasks[key] = target
            try:
                return await call()
            except asyncio.CancelledError:
                if not target.fired or run.abandoned(0):
                    raise  # a stop's, or the job's own
                if task is not None:
                    task.uncancel()
                raise JobCancelled() from None
            finally:
                target.done = True
                self._tasks.pop(key, None)
                CURRENT.reset(token)

        return cancellable

    # -- the watch's side ---------------------------------------------------------
    def runs_of(self, jid: str) -> list[tuple[str, UnitOfWork]]:
        """The slot and unit of work of each run of ``jid`` here now."""
        found = [(t.slot, t.work) for t in list(self._tasks.values()) if t.jid == jid]
        for lane in list(self._lanes.values()):
            with lane.lock:  # the slot and the work of one run, not of two
                if lane.jid == jid and lane.work is not None:
                    found.append((lane.slot, lane.work))
        return found

    def running_jids(self) -> list[str]:
        jids = [lane.jid for lane in list(self._lanes.values()) if lane.jid is not None]
        jids.extend(t.jid for t in list(self._tasks.values()))
        return list(dict.fromkeys(jids))

    def cancel(self, jid: str) -> int:
        """Cancel every run of ``jid`` here not yet cancelled; how many were."""
        fired = 0
        for lane in list(self._lanes.values()):
            with lane.lock:  # never after the run's end, never into the next run
                if lane.jid != jid or lane.fired:
                    continue
                lane.fired = True
                lane.flag.set()
                if not event_loop.cancel(lane.tid, JobCancelled):
                    raise_in(lane.tid, JobCancelled)
            fired += 1
        for target in list(self._tasks.values()):
            if target.jid != jid or target.fired:
                continue
            target.fired = True
            target.flag.set()
            with contextlib.suppress(RuntimeError):  # its loop closed: the task went with it
                target.loop.call_soon_threadsafe(_cancel_task, target)
            fired += 1
        return fired


def _cancel_task(target: Target) -> None:
    """On the task's loop, where the run's end is marked: never into what the task does next."""
    if not target.done and target.task is not None:
        target.task.cancel()


class CancelWatch:
    """Reads the cancel markers of the jids this process runs, every POLL seconds."""

    def __init__(self, step: CancelStep, runtime: Runtime, *,
                 on_kill: Callable[[str], None] | None = None, poll: float = POLL) -> None:
        self.step = step
        self.runtime = runtime
        self.on_kill = on_kill
        self.poll = poll
        self.service = Service("cancel-watch", self._step, name="wurk-cancel-watch",
                               first_pause=poll, failed=logged(log, "cancel.watch_failed", poll))

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()

    def _step(self) -> float:
        self.check()
        return self.poll

    def check(self) -> None:
        jids = self.step.running_jids()
        if not jids:
            return  # an idle process costs Redis nothing
        values = self.runtime.pool.call("MGET", *[keys.cancel(jid) for jid in jids],
                                        idempotent=True)
        served: list[tuple[str, Any]] = []
        for jid, value in zip(jids, values, strict=True):
            if value is None:
                continue
            kill = value in (b"kill", "kill")
            if self.step.cancel(jid):
                log.info("job.cancelling", jid=jid, kill=kill)
            elif not kill:
                continue
            # Also when a plain cancel fired before: the person saw the job go on
            # (stuck in C) and asked again with --kill. A run already taken is not
            # taken twice (the crew's kill takes a slot once).
            if kill and self.on_kill is not None:
                self.on_kill(jid)
            served.append((jid, value))
        if served:
            # A marker served is gone, so a later job pushed with the same jid
            # (an application's own ids) runs; only if unchanged, so a --kill
            # written meanwhile over a plain cancel stays for the next look.
            marked = [keys.cancel(jid) for jid, _ in served]
            self.runtime.pool.run(lambda c: UNIQUE_RELEASE.run(
                c, marked, [value for _, value in served]), idempotent=True)

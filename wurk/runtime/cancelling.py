"""Cancel a running job from any host: the cancel step and the watch that serves it.

A person's cancel (``wurk.api.cancel``) leaves a marker, ``wurk:cancel:<jid>``,
in Redis; no signal crosses a host. The process running that jid finds it
within :data:`POLL` seconds and stops the job.

Duties:
1. :class:`CancelStep`, a step of every job: around its run (``around`` on a
   thread, ``around_async`` as a task) it records which thread or task runs
   which jid and sets the run's :class:`~wurk.core.cancelling.Flag` in
   ``wurk.core.cancelling.CURRENT`` (what ``wurk.cancelled()`` and a class
   job's ``self.cancelled`` read).
2. :meth:`CancelStep.cancel`: set the flag, then raise
   :class:`~wurk.core.job_errors.JobCancelled` in the job's thread at its next
   bytecode (as the job timer raises JobTimeout: ``job_timer.raise_in``), or
   cancel the task the thread waits on (``event_loop.cancel``), or, for a
   native asyncio job, its own task (its CancelledError is turned into
   JobCancelled here, unless a stop took the job). Once per run, and never
   into the next job: the run's end is marked under the same lock, and a
   JobCancelled still pending then is taken and dropped (or becomes the
   run's failure: it did run until cancelled). The lifecycle settles a
   JobCancelled as the "cancelled" ending (``wurk.runtime.lifecycle``).
3. :class:`CancelWatch`: a thread that, while the process runs any job,
   reads the markers of the jids it runs (one MGET each :data:`POLL`
   seconds) and cancels those found. A marker of "kill" also calls
   ``on_kill`` with the jid (the launcher's: the manager settles the job
   as cancelled now, taking it as the job timer takes a job past its hard
   limit, and the process recycles, as at a hard timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wurk.core.cancelling import CURRENT, Flag
from wurk.core.job_errors import JobCancelled
from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.runtime import event_loop
from wurk.runtime.job_timer import raise_in
from wurk.runtime.lifecycle.step import AsyncCall, Call, Run, Step
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime
    from wurk.runtime.work import UnitOfWork

log = get_logger("wurk.cancel")
# Seconds between two reads of the markers: the bound on how long a cancel takes.
POLL = 1.0
_PENDING: Any = object()


@dataclass(eq=False, slots=True)
class Target:
    """One run that may be cancelled: where it runs, and how far its cancel got."""

    jid: str
    tid: int
    slot: str
    work: UnitOfWork
    flag: Flag = field(default_factory=Flag)
    task: asyncio.Task[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    fired: bool = False
    done: bool = False
    # The plain lock: a JobCancelled landing in a Python-level __exit__ could leave it held.
    lock: threading.Lock = field(default_factory=threading.Lock)


def _landing() -> None:
    """An empty Python call: where a pending async exception lands."""


class CancelStep(Step):
    name = "cancel"
    every_job = True

    def __init__(self) -> None:
        # Each run by its target's id: one dict store and one pop a run (each
        # atomic), no lock the threads share; the watch reads a copy.
        self._running: dict[int, Target] = {}

    # -- the job's side ---------------------------------------------------------
    def around(self, run: Run, call: Call) -> Call:
        jid = run.jid
        if jid is None:
            return call

        def cancellable() -> Any:
            target = Target(jid, threading.get_ident(), run.slot, run.work)
            token = CURRENT.set(target.flag)
            outcome = _PENDING
            try:
                try:
                    self._add(target)
                    outcome = call()
                finally:
                    self._end(target)
            except JobCancelled as late:
                # Delivered as the run ended: still the run's failure, never ours.
                self._end(target)
                return late if outcome is _PENDING else outcome
            finally:
                CURRENT.reset(token)
            return outcome

        return cancellable

    def around_async(self, run: Run, call: AsyncCall) -> AsyncCall:
        jid = run.jid
        if jid is None:
            return call

        async def cancellable() -> Any:
            task = asyncio.current_task()
            target = Target(jid, threading.get_ident(), run.slot, run.work, task=task,
                            loop=asyncio.get_running_loop())
            token = CURRENT.set(target.flag)
            self._add(target)
            try:
                return await call()
            except asyncio.CancelledError:
                if not target.fired or run.abandoned(0):
                    raise  # a stop's, or the job's own
                if task is not None:
                    task.uncancel()
                raise JobCancelled() from None
            finally:
                self._end(target)
                CURRENT.reset(token)

        return cancellable

    def _add(self, target: Target) -> None:
        self._running[id(target)] = target

    def _end(self, target: Target) -> None:
        with target.lock:
            if target.done:
                return
            target.done = True
            fired = target.fired and target.task is None
        self._running.pop(id(target), None)
        if fired:
            with contextlib.suppress(JobCancelled):
                _landing()

    # -- the watch's side ---------------------------------------------------------
    def targets(self, jid: str) -> list[Target]:
        return [t for t in list(self._running.values()) if t.jid == jid]

    def running_jids(self) -> list[str]:
        return list(dict.fromkeys(t.jid for t in list(self._running.values())))

    def cancel(self, jid: str) -> int:
        """Cancel every run of ``jid`` here not yet cancelled; how many were."""
        fired = 0
        for target in self.targets(jid):
            with target.lock:
                if target.fired or target.done:
                    continue
                target.fired = True
                target.flag.set()
                self._fire(target)
            fired += 1
        return fired

    def _fire(self, target: Target) -> None:
        """Under the run's lock, so never after the run's end."""
        if target.task is not None and target.loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed: the task went with it
                target.loop.call_soon_threadsafe(target.task.cancel)
        elif not event_loop.cancel(target.tid, JobCancelled):
            raise_in(target.tid, JobCancelled)


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
        for jid, value in zip(jids, values, strict=True):
            if value is None or not self.step.cancel(jid):
                continue
            kill = value in (b"kill", "kill")
            log.info("job.cancelling", jid=jid, kill=kill)
            if kill and self.on_kill is not None:
                self.on_kill(jid)

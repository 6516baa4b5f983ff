"""The asyncio executor: one event loop per process runs up to ``concurrency`` jobs at once.

``executor = "asyncio"`` (``wurk run --executor asyncio``, or a topology
slot's ``executor``) makes the launcher build an :class:`AsyncManager`
instead of the threads :class:`~wurk.runtime.manager.Manager`. Each holds a
:class:`~wurk.runtime.crew.Crew` of its own (the fetch, the lifecycle, the
in-flight table, counters and hand-back); this one changes who runs the jobs.

Duties:
1. Feed the loop from the same fetch machinery (basic, or reliable with its
   private list, claims, acks, suspects and poison pills). With reliable
   fetch one feeder thread takes every free place (:class:`Places`, of
   ``concurrency``) and fills them with one claim; with basic fetch a few
   feeder threads (:data:`FEEDERS`) each take a place and hold one BRPOP
   open. Fetched jobs go to the process's loop (``wurk.runtime.event_loop``),
   where each becomes a task (:meth:`AsyncProcessor.process_async`) under
   a slot of its own in the in-flight table, which the heartbeat reports;
   a job's settlement runs on a bookkeeping thread (a plain success's on
   the loop: see ``wurk.runtime.aio_processor``), and only then is its
   place free. One wake-up of the loop carries every job handed over
   meanwhile, and one hand-off to a bookkeeping thread every settlement of
   a pass of the loop. A process never holds more than ``concurrency``
   jobs (a feeder takes its places before it fetches).
2. A fetch that raises is logged and the feeder pauses; a task that raises
   past the processor (a bug of ours) gives its job back; a job fetched as
   the loop went away goes back to its queue. Nothing is dropped.
3. ``stop(deadline)``: stop fetching (``quiet``), give back at once the
   sync jobs still waiting for a pool thread, wait for running jobs
   until the deadline, push the unfinished back in one pipeline (their late
   outcome is dropped), then cancel their tasks and give them a moment
   (:data:`CANCEL_GRACE`) to unwind, so no task is left pending; a task
   cancelled before it began hands its job back too. Then the fetch stops,
   the feeders are joined and the thread pools wound down. Sync jobs still
   running in the pool cannot be cancelled: their jobs were pushed back and
   their threads are daemons.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
import time
from typing import TYPE_CHECKING

from wurk.core import logging as wlog
from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.runtime import event_loop
from wurk.runtime.aio_processor import AsyncProcessor, Settle
from wurk.runtime.crew import CrewDriver
from wurk.runtime.manager import ERROR_PAUSE, Manager
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.settings.config import ASYNCIO_FEEDERS

if TYPE_CHECKING:
    from collections.abc import Callable

    from wurk.push.job import Registry
    from wurk.redis.runtime import Runtime
    from wurk.runtime.work import UnitOfWork
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.manager")
# Feeder threads per process with basic fetch (at most): each holds one BRPOP open.
FEEDERS = ASYNCIO_FEEDERS
# How long a feeder waits for a free place before it looks at quiet again.
FEED_WAIT = 0.5
# How long cancelled tasks get to unwind at a stop.
CANCEL_GRACE = 1.0


def make_manager(config: Config, plan: QueuePlan, registry: Registry,
                 identity: str, *, runtime: Runtime | None = None) -> Manager | AsyncManager:
    """The manager ``config.executor`` names."""
    if config.executor == "asyncio":
        return AsyncManager(config, plan, registry, identity, runtime=runtime)
    return Manager(config, plan, registry, identity, runtime=runtime)


class AsyncManager(CrewDriver):
    def __init__(self, config: Config, plan: QueuePlan, registry: Registry,
                 identity: str, *, runtime: Runtime | None = None) -> None:
        super().__init__(config, plan, registry, identity, runtime=runtime)
        self.tasks = AsyncProcessor(self.lifecycle, self.processor)
        self._places = Places(config.concurrency)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._active = 0  # handed to the loop, task not yet done
        self._tasks: set[asyncio.Task[bool]] = set()  # the loop thread's alone
        self._settling: list[tuple[str, UnitOfWork, Settle]] = []  # the loop thread's alone
        self._inbox: list[UnitOfWork] = []  # fetched, for the loop; under _lock
        self._wake_due = False  # the loop was asked to take the inbox; under _lock
        self._wake_loop: asyncio.AbstractEventLoop | None = None  # the loop asked
        self._unstarted: list[UnitOfWork] = []  # cancelled before they began
        self._stopping = False
        self._numbers = itertools.count(1)

    def start(self) -> None:
        event_loop.loop()  # started now: the first job does not pay for it
        self.fetch.start()
        if isinstance(self.fetch, ReliableFetch):
            self._threads.append(threads.start(
                "feeder", functools.partial(self._feed_many, self.fetch),
                stopped=self._quiet.is_set, name="wurk-feeder"))
            return
        for index in range(min(self.config.concurrency, FEEDERS)):
            self._threads.append(threads.start("feeder", self._feed, stopped=self._quiet.is_set,
                                               name=f"wurk-feeder-{index}"))

    def running(self) -> int:
        """Jobs handed to the loop and not yet settled."""
        with self._lock:
            return self._active

    # -- feeder threads ---------------------------------------------------------
    def _feed(self) -> None:
        """One place, one fetch (basic fetch: each feeder holds one BRPOP open)."""
        while not self._quiet.is_set():
            if not self._places.take(1, timeout=FEED_WAIT):
                continue
            self._fetched(1, self._fetch_one)

    def _feed_many(self, fetch: ReliableFetch) -> None:
        """Every free place at once, filled by one claim (reliable fetch)."""
        while not self._quiet.is_set():
            free = self._places.take(self.config.concurrency, timeout=FEED_WAIT)
            if free:
                self._fetched(free, fetch.fetch_many)

    def _fetch_one(self, _most: int) -> list[UnitOfWork]:
        work = self.fetch.fetch()
        return [] if work is None else [work]

    def _fetched(self, places: int, fetch: Callable[[int], list[UnitOfWork]]) -> None:
        """Fetch up to ``places`` jobs for the places taken; free what is left over."""
        try:
            works = fetch(places)
        except BaseException as exc:  # noqa: BLE001 - nothing may kill the feeder
            self._places.give(places)
            log.error("fetch.error", error=threads.describe(exc))
            self._quiet.wait(ERROR_PAUSE)
            return
        if len(works) < places:
            self._places.give(places - len(works))
        if not works:
            return
        if self._stopping:  # taken by a fetch still open as the stop went by
            self._places.give(len(works))
            for work in works:
                self.crew.give_back("", work)
            return
        self._hand_over(works)  # even once quiet: basic fetch already took it

    def _hand_over(self, works: list[UnitOfWork]) -> None:
        """To the loop; one wake-up of the loop carries every job handed over meanwhile."""
        loop = event_loop.loop()
        with self._lock:
            self._active += len(works)
            self._inbox.extend(works)
            # A loop a job stopped may never run the wake-up it was sent: ask the new one.
            if self._wake_due and self._wake_loop is loop:
                return
            self._wake_due, self._wake_loop = True, loop
        try:
            loop.call_soon_threadsafe(self._take_inbox)
        except RuntimeError:  # the loop closed as they were handed over
            for stranded in self._empty_inbox():
                self._ended()
                self.crew.give_back("", stranded)

    def _empty_inbox(self) -> list[UnitOfWork]:
        with self._lock:
            works, self._inbox = self._inbox, []
            self._wake_due = False
        return works

    # -- the loop thread ----------------------------------------------------------
    def _take_inbox(self) -> None:
        if self._settling:  # left by a loop that stopped before it could send them
            self._send_settling()
        for work in self._empty_inbox():
            self._spawn(work)

    def _spawn(self, work: UnitOfWork) -> None:
        slot = "a" + wlog.base36(next(self._numbers))
        task = asyncio.get_running_loop().create_task(self._one(work, slot))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._done, work))

    async def _one(self, work: UnitOfWork, slot: str) -> bool:
        """Run the job; True when its settlement was handed to a bookkeeping thread."""
        try:
            settle = await self.tasks.process_async(work, slot)
        except asyncio.CancelledError:
            # A stop pushed the job back (its outcome is dropped); anything
            # else that cancels (the loop winding down) leaves it to give back.
            if not self._stopping and self.in_flight.slots() & {slot}:
                self._give_back_aside(slot, None)
            return False
        except BaseException as exc:  # noqa: BLE001 - a bug of ours: the job goes back
            log.error("processor.error", queue=work.queue, error=threads.describe(exc))
            self._give_back_aside(slot, work)
            return False
        if settle is None:
            return False
        self._settling.append((slot, work, settle))
        if len(self._settling) == 1:  # one hand-off per pass of the loop, for all of them
            asyncio.get_running_loop().call_soon(self._send_settling)
        return True

    def _send_settling(self) -> None:
        batch, self._settling = self._settling, []
        self.tasks.bookkeeping.submit(self._settle_all, batch)

    def _settle_all(self, batch: list[tuple[str, UnitOfWork, Settle]]) -> None:
        """On a bookkeeping thread: settle each job, then free its place."""
        for slot, work, settle in batch:
            try:
                settle()
            except BaseException as exc:  # noqa: BLE001 - a bug of ours: the job goes back
                log.error("processor.error", queue=work.queue, error=threads.describe(exc))
                self.crew.give_back(slot, work)
            finally:
                self._ended()

    def _done(self, work: UnitOfWork, task: asyncio.Task[bool]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.result():
            return  # its settlement frees its place
        if task.cancelled():  # cancelled before its first step: never began
            with self._lock:
                stopping = self._stopping
                if stopping:
                    self._unstarted.append(work)
            if not stopping:
                self._give_back_aside("", work)
        self._ended()

    def _give_back_aside(self, slot: str, work: UnitOfWork | None) -> None:
        """``Crew.give_back`` off the loop (it is a Redis round trip)."""
        threading.Thread(target=self.crew.give_back, args=(slot, work), daemon=True,
                         name="wurk-give-back").start()

    def _ended(self) -> None:
        self._places.give(1)
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._settled.notify_all()

    def _cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- stop -------------------------------------------------------------------
    def stop(self, deadline: float) -> int:
        """Quiet, wait for running jobs until ``deadline`` (monotonic), hand back the rest."""
        self.quiet()
        # Sync jobs still waiting for a pool thread go straight back, unstarted.
        requeued = self._give_back_unstarted(self.tasks.take_unstarted())
        self._wait_settled(deadline)
        with self._lock:
            # From now on a feeder gives back itself what its last fetch returns.
            self._stopping = True
        leftovers = self.in_flight.abandon_all()
        requeued += self.crew.requeue(leftovers)
        requeued += self._give_back_unstarted(self.tasks.take_unstarted())
        if self.running():
            self._cancel_on_loop()
            self._wait_settled(time.monotonic() + self._grace())
        self.timer.stop()
        self.fetch.stop()
        self.crew.drain_fetches()
        self._wait_settled(time.monotonic() + self._grace())
        with self._lock:
            unstarted, self._unstarted = self._unstarted, []
        requeued += self._give_back_unstarted(unstarted + self.tasks.take_unstarted())
        self.tasks.stop_pools()
        return requeued

    def _grace(self) -> float:
        """A wait for cancelled tasks: at most half of what is left of the drain's
        deadline for Redis, so the give-backs after it still get through."""
        left = self.runtime.pool.deadline.clip(CANCEL_GRACE)
        return CANCEL_GRACE if left is None else left / 2

    def _wait_settled(self, deadline: float) -> bool:
        with self._settled:
            return self._settled.wait_for(lambda: self._active == 0,
                                          timeout=max(0.0, deadline - time.monotonic()))

    def _cancel_on_loop(self) -> None:
        with contextlib.suppress(RuntimeError):  # closed: its tasks went with it
            event_loop.loop().call_soon_threadsafe(self._cancel_tasks)

    def _give_back_unstarted(self, works: list[UnitOfWork]) -> int:
        if not works:
            return 0
        try:
            moved = self.fetch.requeue(works)
        except Exception as exc:  # noqa: BLE001 - reliable fetch's release gives them back
            log.error("shutdown.requeue_failed", jobs=len(works), error=repr(exc))
            return 0
        log.warning("shutdown.requeued", jobs=len(works), unstarted=True)
        return moved


class Places:
    """The process's free places for jobs, ``concurrency`` of them: a feeder
    takes one, or every free one at once, before it fetches."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._free = total
        self._changed = threading.Condition()

    def take(self, most: int, timeout: float) -> int:
        """Up to ``most`` free places, waiting up to ``timeout`` for one; 0 if none came."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._free > 0, timeout=timeout):
                return 0
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def give(self, count: int) -> None:
        with self._changed:
            if self._free + count > self._total:
                raise ValueError("more places given back than were taken")
            self._free += count
            self._changed.notify()

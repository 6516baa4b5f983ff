"""The asyncio executor's processor: drives one fetched job through its lifecycle as a task.

The run is the job lifecycle's skeleton (``wurk.runtime.lifecycle``), the
same one the threads executor drives, so every outcome (acknowledge, the
atomic settle, retries, dead, and each feature's steps) is settled the same
way and the guarantees are the same ones. This driver adds what is
particular to a task on the process's loop:

Duties:
1. An ``async def`` job whose server middleware is all ``async def`` (or
   absent), with no step that needs a thread (a profile), runs natively:
   its coroutine and the middleware chain are awaited in this task (the
   job's payload in ``wurk.runtime.middleware``'s context variable, the
   batch it belongs to in ``wurk.batches.client``'s, both per task), under
   its steps' ``around_async`` hooks (time limits), with the same
   ``job.start``/``job.done``/``job.fail`` lines (``tid`` is the slot) and
   the same metrics and per-class figures when they are on.
2. Every other job (a sync job, an unknown class, a malformed payload, an
   async job behind a sync middleware, a profiled one) runs on the
   executor's bounded pool of sync threads (``executor_threads``) through
   the threads executor's :class:`~wurk.runtime.processor.Processor`; an
   async job there waits on this same loop (``wurk.runtime.event_loop``), never
   blocking it.
3. Redis bookkeeping never runs on the loop: a native job's ``admit`` and
   ``start`` steps (expiry, a unique lock released at start) run on a small
   pool of bookkeeping threads, and its settlement (success: its steps and
   the acknowledgement; failure: error handlers, retry plan, atomic settle)
   is returned for the manager to run there, many at a time; a Redis outage
   stalls only the jobs that must wait for it. A plain success (no step
   with anything to write) settles on the loop, saving the hand-off:
   its acknowledgement waits for the next claim, or, when reliable fetch's
   fetcher blocks or stops, is sent from a bookkeeping thread (basic fetch
   has nothing to acknowledge).
4. A stop cancels the task: its outcome is dropped (the in-flight table
   shows the stop took the job), as a thread's is.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from wurk.runtime import event_loop, middleware
from wurk.runtime.thread_pool import ThreadPool
from wurk.settings import config as config_module
from wurk.wire import keywords
from wurk.wire.payload import PayloadError, loads_job

if TYPE_CHECKING:
    from wurk.push.job import Registered
    from wurk.runtime.lifecycle.skeleton import Lifecycle
    from wurk.runtime.lifecycle.step import Plan, Run
    from wurk.runtime.processor import Processor
    from wurk.runtime.work import UnitOfWork
    from wurk.settings.config import Config
    from wurk.settings.hooks import ServerMiddleware

# A job's settlement, to run on a bookkeeping thread.
Settle = Callable[[], None]


def sync_threads(config: Config) -> int:
    """The size of the pool that runs sync jobs: ``executor_threads``, or derived."""
    return config_module.sync_threads(config.concurrency, config.executor_threads)


class AsyncProcessor:
    def __init__(self, lifecycle: Lifecycle, threaded: Processor) -> None:
        self.lifecycle = lifecycle
        self.threaded = threaded  # runs every job that is not native, on a sync thread
        config = lifecycle.config
        self.sync_pool = ThreadPool(sync_threads(config), "sync")
        # Bookkeeping threads: a round trip or two per job each, never a job's own code.
        self.bookkeeping = ThreadPool(min(config.concurrency, config_module.ASYNCIO_BOOKKEEPING),
                                      "bookkeeping")
        self._chain_seen: tuple[int, ...] = ()
        self._chain_async = False

    def stop_pools(self) -> None:
        self.sync_pool.stop()
        self.bookkeeping.stop()

    def take_unstarted(self) -> list[UnitOfWork]:
        """Jobs queued for a sync thread that none has started (a stop gives them back)."""
        return [args[0] for fn, args in self.sync_pool.take_queued()
                if fn == self.threaded.process]

    async def process_async(self, work: UnitOfWork, slot: str) -> Settle | None:
        """Run one job; what is left to do off the loop (its settlement), if anything.

        Nothing a job or Redis does makes it raise.
        """
        try:
            job: dict[str, Any] | None = loads_job(work.raw)
        except PayloadError:
            job = None
        lifecycle = self.lifecycle
        entry = lifecycle.registry.find(job["class"]) if job is not None else None
        plan = self._native_plan(job, entry) if job is not None and entry is not None else None
        if job is None or entry is None or plan is None:
            await self.sync_pool.call(self.threaded.process, work, slot)
            return None
        run = lifecycle.begin(work, slot, job, entry, plan)
        if run is None:
            # Fetched after a stop gave up waiting: straight back, off the loop.
            return functools.partial(lifecycle.requeue_or_report, work)
        return await self._native_run(run)

    def _native_plan(self, job: dict[str, Any], entry: Registered) -> Plan | None:
        """The job's plan when it runs natively on the loop; None for a sync thread."""
        if not entry.coroutine or not self._chain_is_async():
            return None
        plan = self.lifecycle.plan_for(job, entry)
        return None if plan.needs_thread else plan

    def _chain_is_async(self) -> bool:
        """Whether every server middleware is async, looked at again only when
        the chain changes (one may be added after the worker started)."""
        chain = self.lifecycle.config.server_middleware
        seen = (id(chain), len(chain), *map(id, chain))
        if seen != self._chain_seen:
            self._chain_seen, self._chain_async = seen, all_async(chain)
        return self._chain_async

    async def _native_run(self, run: Run) -> Settle | None:
        lifecycle, plan = self.lifecycle, run.plan
        if plan.admit and not await self.bookkeeping.call(lifecycle.admit, run):
            return None
        if plan.start:
            await self.bookkeeping.call(lifecycle.start, run)
        lifecycle.enter(run)
        try:
            failure = await self._execute_native(run)
        finally:
            lifecycle.exit(run)
        if failure is not None:
            return functools.partial(lifecycle.failed, run, failure)
        if plan.settles:
            return functools.partial(lifecycle.succeeded, run)
        # A plain success: settled on the loop, saving the hand-off to a
        # bookkeeping thread. Its ack waits for the next claim, or, when it
        # must go at once, is sent from a bookkeeping thread.
        lifecycle.succeeded(run, send=self.bookkeeping.submit)
        return None

    async def _execute_native(self, run: Run) -> BaseException | None:
        lifecycle = self.lifecycle
        lines = lifecycle.lines(run, run.slot)
        started = time.perf_counter()
        try:
            chain = lifecycle.config.server_middleware
            call = functools.partial(run_chain, chain, run.job, run.queue, run.entry)
            run.value = await (lifecycle.around_async(run, call)() if run.plan.around_async
                               else call())
        except BaseException as exc:  # noqa: BLE001 - the job's failure, whatever it is
            if isinstance(exc, asyncio.CancelledError) and run.abandoned(0):
                # A stop's cancel: said as the threads executor says it.
                exc = event_loop.HandedBack()
            lifecycle.ran(run, lines, exc, started, run.slot)
            return exc
        lifecycle.ran(run, lines, None, started, run.slot)
        return None


def all_async(chain: Sequence[ServerMiddleware]) -> bool:
    return all(middleware.is_async(m) for m in chain)


async def run_chain(chain: Sequence[ServerMiddleware], job: dict[str, Any], queue: str,
                    entry: Registered | None) -> Any:
    """The job's middleware chain and the job, awaited in this task; the job's value."""
    assert entry is not None  # a native run has its class
    token = middleware._current.set(job)  # this task's own context
    try:
        if not chain:  # the job's own coroutine, with no frames of ours around it
            args, kwargs = keywords.split(job)
            outcome = entry.factory(job)(*args, **kwargs)
            return await outcome if inspect.isawaitable(outcome) else outcome
        return await _step(chain, 0, job, queue, lambda: _perform(entry, job))
    finally:
        middleware._current.reset(token)


async def _perform(entry: Registered, job: dict[str, Any]) -> Any:
    args, kwargs = keywords.split(job)
    outcome = entry.factory(job)(*args, **kwargs)
    # A decorator around a coroutine function may have awaited it already.
    return await outcome if inspect.isawaitable(outcome) else outcome


async def _step(chain: Sequence[ServerMiddleware], index: int, job: dict[str, Any],
                queue: str, perform: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if index == len(chain):
        return await perform()

    def rest() -> Coroutine[Any, Any, Any]:
        return _step(chain, index + 1, job, queue, perform)

    return await chain[index](job, queue, rest)

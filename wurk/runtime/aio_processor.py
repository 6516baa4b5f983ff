"""The asyncio executor's processor: one fetched job, run as a task on the process's loop.

It is the threads executor's :class:`~wurk.runtime.processor.Processor`
with one more entry point, :meth:`AsyncProcessor.process_async`; every
outcome goes through the same methods (acknowledge, the atomic settle,
retries, dead, results, batches, unique locks), so the guarantees are the
same ones.

Duties:
1. An ``async def`` job whose server middleware is all ``async def`` (or
   absent), with no profile asked, runs natively:
   its coroutine and the middleware chain are awaited in this task (the
   job's payload in ``wurk.runtime.middleware``'s context variable, the
   batch it belongs to in ``wurk.push.batch``'s, both per task), under
   ``wurk.runtime.aio_limits`` when it has time limits, with the same
   ``job.start``/``job.done``/``job.fail`` lines (``tid`` is the slot) and
   the same metrics and per-class figures when they are on.
2. Every other job (a sync job, an unknown class, a malformed payload, an
   async job behind a sync middleware, a profiled one) runs on the
   executor's bounded pool of sync threads (``executor_threads``) through the threads executor's own
   ``Processor.process``, unchanged; an async job there waits on this same
   loop (``wurk.runtime.aio``), never blocking it.
3. Redis bookkeeping never runs on the loop: a native job's start checks
   (expiry, a unique lock released at start) run on a small pool of
   bookkeeping threads, and its settlement (success: the result, batch and
   acknowledgement; failure: error handlers, retry plan, atomic settle) is
   returned for the manager to run there, many at a time; a Redis outage
   stalls only the jobs that must wait for it. A plain success (no result,
   batch or unique lock to write) settles on the loop, saving the hand-off:
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

from wurk.core import joblog
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.limiter.base import reschedulable
from wurk.observe import metrics
from wurk.runtime import aio, aio_limits, batch, middleware, results, time_limits, unique
from wurk.runtime.aio_pool import ThreadPool
from wurk.runtime.processor import Processor
from wurk.settings import config as config_module
from wurk.wire import batch as batch_wire
from wurk.wire import unique as unique_wire
from wurk.wire.payload import PayloadError, loads_job

if TYPE_CHECKING:
    from wurk.push.job import Registered, Registry
    from wurk.runtime.inflight import Counters, InFlightTable
    from wurk.runtime.work import Fetch, UnitOfWork
    from wurk.settings.config import Config
    from wurk.settings.hooks import ServerMiddleware

log = get_logger("wurk.processor")
# A job's settlement, to run on a bookkeeping thread.
Settle = Callable[[], None]


def sync_threads(config: Config) -> int:
    """The size of the pool that runs sync jobs: ``executor_threads``, or derived."""
    return config_module.sync_threads(config.concurrency, config.executor_threads)


class AsyncProcessor(Processor):
    def __init__(self, config: Config, registry: Registry, fetch: Fetch,
                 counters: Counters, in_flight: InFlightTable) -> None:
        super().__init__(config, registry, fetch, counters, in_flight)
        self.sync_pool = ThreadPool(sync_threads(config), "sync")
        # Bookkeeping threads: a round trip or two per job each, never a job's own code.
        self.bookkeeping = ThreadPool(min(config.concurrency, config_module.ASYNCIO_BOOKKEEPING),
                                      "bookkeeping")
        self._observed = metrics.for_config(config)
        self.hard_limits = aio_limits.HardWatch(self.timer)
        self._chain_seen: tuple[int, ...] = ()
        self._chain_async = False

    def stop_pools(self) -> None:
        self.hard_limits.stop()
        self.sync_pool.stop()
        self.bookkeeping.stop()

    def take_unstarted(self) -> list[UnitOfWork]:
        """Jobs queued for a sync thread that none has started (a stop gives them back)."""
        return [args[0] for fn, args in self.sync_pool.take_queued() if fn == self.process]

    async def process_async(self, work: UnitOfWork, slot: str) -> Settle | None:
        """Run one job; what is left to do off the loop (its settlement), if anything.

        Nothing a job or Redis does makes it raise.
        """
        try:
            job: dict[str, Any] | None = loads_job(work.raw)
        except PayloadError:
            job = None
        entry = self.registry.find(job["class"]) if job is not None else None
        if job is None or entry is None or not self._native(job, entry):
            await self.sync_pool.call(self.process, work, slot)
            return None
        return await self._native_run(job, work, slot, entry)

    def _native(self, job: dict[str, Any], entry: Registered) -> bool:
        return entry.coroutine and "profile" not in job and self._chain_is_async()

    def _chain_is_async(self) -> bool:
        """Whether every server middleware is async, looked at again only when
        the chain changes (one may be added after the worker started)."""
        chain = self.config.server_middleware
        seen = (id(chain), len(chain), *map(id, chain))
        if seen != self._chain_seen:
            self._chain_seen, self._chain_async = seen, all_async(chain)
        return self._chain_async

    async def _native_run(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                          entry: Registered) -> Settle | None:
        if not self.in_flight.begin(slot, work, job):
            # Fetched after a stop gave up waiting: straight back.
            return functools.partial(self._requeue_or_report, work)
        limits = time_limits.read(job, entry.options)
        if limits.expiry is not None and await self.bookkeeping.call(
                self._expired, job, work, slot, limits.expiry):
            return None
        if unique_wire.FOR in job:
            await self.bookkeeping.call(unique.started, self.config, job)
        running = batch.started(job)
        failure, value = await self._execute_native(job, work, slot, entry, limits)
        batch.stopped(running)
        if failure is None:
            if self._settled_here(job, work, slot):
                return None
            return functools.partial(self._succeeded_with, job, work, slot, value)
        return functools.partial(self._failed_and_done, job, work, slot, failure, entry)

    def _settled_here(self, job: dict[str, Any], work: UnitOfWork, slot: str) -> bool:
        """Settle a plain success on the loop (no result, batch or unique lock
        to write): it saves the hand-off to a bookkeeping thread. Its ack
        waits for the next claim, or, when it must go at once, is sent from
        a bookkeeping thread."""
        if results.TTL in job or batch_wire.FIELD in job or unique_wire.LOCK in job:
            return False
        # With none of those fields, no Redis call on this thread.
        self._succeeded(job, work, slot, send=self.bookkeeping.submit)
        return True

    def _succeeded_with(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                        value: Any) -> None:
        if results.TTL in job:  # held for this (bookkeeping) thread, as a job thread holds it
            results.capturing(lambda: value)()
        self._succeeded(job, work, slot)

    def _failed_and_done(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                         failure: BaseException, entry: Registered) -> None:
        self._failed(job, work, slot, failure, entry)
        self.in_flight.finish(slot)

    async def _execute_native(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                              entry: Registered, limits: time_limits.Limits,
                              ) -> tuple[BaseException | None, Any]:
        jid = job.get("jid") if isinstance(job.get("jid"), str) else None
        context = {"jid": jid, "class": job["class"], "queue": work.queue, "tid": slot}
        lines = joblog.job_lines(log, context)
        if lines is not None:
            lines.start()
        started = time.perf_counter()
        try:
            step = run_chain(self.config.server_middleware, job, work.queue, entry)
            if limits.bounded:
                run = aio_limits.make_run(slot, work, jid, entry.options, limits)
                value = await aio_limits.bounded(self.hard_limits, run, step)
            else:
                value = await step
        except BaseException as exc:  # the job's failure, whatever it is
            if isinstance(exc, asyncio.CancelledError) and self.in_flight.abandoned(slot):
                exc = aio.HandedBack()  # a stop's cancel: said as the threads executor says it
            elapsed = time.perf_counter() - started
            self._measured(job, work.queue, elapsed, exc)
            if reschedulable(exc, job):
                return exc, None  # not a failure: _rescheduled logs it as job.over_limit
            log.warning("job.fail", elapsed=round(elapsed, 6), error=describe(exc),
                        exc_info=exc, **context)
            return exc, None
        elapsed = time.perf_counter() - started
        self._measured(job, work.queue, elapsed, None)
        if lines is not None:
            lines.done(round(elapsed, 6))
        return None, value

    def _measured(self, job: dict[str, Any], queue: str, elapsed: float,
                  failure: BaseException | None) -> None:
        """What the threads path's metrics wrappers record (``wurk.observe``), when on."""
        if self._observed is None and not self.config.class_metrics:
            return
        try:
            failed = failure is not None and not reschedulable(failure, job)
            if self._observed is not None:
                self._observed.job(metrics.job_class(job), queue, elapsed * 1000.0, failed)
            if self.config.class_metrics:
                self.counters.classes.record(metrics.job_class(job), elapsed * 1000.0,
                                             failed=failed)
        except BaseException as exc:  # noqa: BLE001 - a metrics bug must not touch the job
            log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")


def all_async(chain: Sequence[ServerMiddleware]) -> bool:
    return all(middleware.is_async(m) for m in chain)


async def run_chain(chain: Sequence[ServerMiddleware], job: dict[str, Any], queue: str,
                entry: Registered) -> Any:
    """The job's middleware chain and the job, awaited in this task; the job's value."""
    token = middleware._current.set(job)  # this task's own context
    try:
        if not chain:  # the job's own coroutine, with no frames of ours around it
            outcome = entry.factory(job)(*job["args"])
            return await outcome if inspect.isawaitable(outcome) else outcome
        return await _step(chain, 0, job, queue, lambda: _perform(entry, job))
    finally:
        middleware._current.reset(token)


async def _perform(entry: Registered, job: dict[str, Any]) -> Any:
    outcome = entry.factory(job)(*job["args"])
    # A decorator around a coroutine function may have awaited it already.
    return await outcome if inspect.isawaitable(outcome) else outcome


async def _step(chain: Sequence[ServerMiddleware], index: int, job: dict[str, Any],
                queue: str, perform: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if index == len(chain):
        return await perform()

    def rest() -> Coroutine[Any, Any, Any]:
        return _step(chain, index + 1, job, queue, perform)

    return await chain[index](job, queue, rest)

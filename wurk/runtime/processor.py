"""The processor: runs one fetched unit of work from raw bytes to its settlement.

Duties, in order, for each job:
1. Parse, or kill: a payload that is not a job object (not JSON, NaN or an
   overflowing number, nested too deep to decode, no class or args) goes to
   ``dead`` as the raw string, with no retry and no failure count (as
   Sidekiq does). A job fetched past its ``expiry`` is acknowledged unrun
   (``wurk.runtime.time_limits``).
2. Resolve the class through the registry only; an unknown name is an
   ordinary failure, so it retries and finally dies.
3. Run it inside the server middleware chain, timing it and logging one line
   at start and one at the end; under cProfile when the payload asks for a
   profile (``wurk.observe.profiler``), and timed and counted while metrics are on
   (``wurk.observe.metrics``) and per class (``wurk.observe.class_metrics``,
   ``class_metrics``). With all off the run path is unchanged. Whatever the
   job or its middleware raises, ``SystemExit`` and ``KeyboardInterrupt``
   included, is the job's failure: nothing a job does ends the thread.
   A job with a ``timeout`` or ``hard_timeout`` runs under the process's
   job timer (``wurk.runtime.job_timer``).
4. On success: count it and acknowledge it. On failure: count it, call the
   error handlers, let the retry handler say where it goes, and settle it:
   the removal of this run's claimed copy and the write of its retry or dead
   entry are one atomic step (``wurk.runtime.settle``), retried with backoff through
   Redis trouble, so a failure is never followed by an acknowledgement that
   could delete a later copy, and a job whose failure cannot be written yet
   stays in its private list instead of vanishing. A job a limiter refused
   (``OverLimit``) is rescheduled the same way, spending no retry
   (``wurk.runtime.overlimit``). A failure that cannot
   even be serialised sends the raw payload to ``dead``, with the reason
   logged.
5. Tell :mod:`wurk.runtime.unique` when a unique job starts and how it
   ended, so its lock goes when its ``unique_until`` says.
6. Store the outcome of a job that asked for it (``result_ttl`` in the
   payload: :mod:`wurk.runtime.results`) before its acknowledgement or
   settle; any other job pays one dict lookup.
7. Tell :mod:`wurk.runtime.batch` when a batch job runs and how it ended
   (before its ack or settle), so its batch counts it and fires callbacks.
7. Drop this execution's outcome when the launcher already pushed the job
   back to Redis during a hard stop (the job runs again, which the
   at-least-once contract allows), and stop retrying a settle once a hard
   stop abandons the job (its copy stays for the stop's release or the
   reaper).

Nothing a job or Redis does makes ``process`` raise; anything that still
does is a bug of ours, left to the manager's guard, which gives the job
back (``Manager._give_back``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.core import joblog
from wurk.core import logging as wlog
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.limiter.base import reschedulable
from wurk.observe import class_metrics, metrics, profiler
from wurk.push.job import Registered, Registry, UnknownJobError
from wurk.push.time_options import JobExpiredError
from wurk.runtime import aio, batch, middleware, overlimit, results, settle, time_limits, unique
from wurk.runtime.job_timer import JobTimer
from wurk.runtime.retry import RetryHandler
from wurk.runtime.work import Sender, Settlement
from wurk.wire.payload import PayloadError, loads_job

if TYPE_CHECKING:
    from wurk.runtime.inflight import Counters, InFlightTable
    from wurk.runtime.work import Fetch, UnitOfWork
    from wurk.settings.config import Config

log = get_logger("wurk.processor")
RunJob = Callable[[dict[str, Any], str, Registered | None], BaseException | None]


class Processor:
    def __init__(self, config: Config, registry: Registry, fetch: Fetch,
                 counters: Counters, in_flight: InFlightTable) -> None:
        self.config = config
        self.registry = registry
        self.fetch = fetch
        self.counters = counters
        self.in_flight = in_flight
        self.retry = RetryHandler(config)
        # Soft and hard time limits; its thread starts with the first bounded job.
        self.timer = JobTimer(config, fetch, in_flight, counters, self.retry)
        # Metrics on: every run is timed and counted. Off: the plain method, nothing added.
        observed = metrics.for_config(config)
        self._run_job: RunJob = self._run if observed is None else observed.timed(self._run)
        self._run_job = class_metrics.tracked(config, counters.classes, self._run_job)

    def process(self, work: UnitOfWork, slot: str) -> None:
        try:
            job = loads_job(work.raw)
        except PayloadError as exc:
            self._malformed(work, slot, str(exc))
            return
        if not self.in_flight.begin(slot, work, job):
            # Fetched after a hard stop gave up waiting: hand it straight back.
            self._requeue_or_report(work)
            return
        # Anything raised past here is a bug of ours, not the job's: the slot
        # stays recorded, and the manager's guard gives its job back.
        entry = self.registry.find(job["class"])
        limits = time_limits.read(job, entry.options if entry else None)
        if limits.expiry is not None and self._expired(job, work, slot, limits.expiry):
            return
        unique.started(self.config, job)
        running = batch.started(job)
        failure = (self.timer.run(slot, work, job, entry.options if entry else None,
                                  limits=limits, call=lambda: self._execute(job, work.queue, entry))
                   if limits.bounded else self._execute(job, work.queue, entry))
        batch.stopped(running)
        if failure is None:
            self._succeeded(job, work, slot)
        else:
            self._failed(job, work, slot, failure, entry)
            self.in_flight.finish(slot)

    def _expired(self, job: dict[str, Any], work: UnitOfWork, slot: str, expiry: float) -> bool:
        if time.time() <= expiry:
            return False
        # A result waiter and the job's batch learn it will never run, before
        # the ack: a crash between leaves it to be fetched, and dropped, again.
        gone = JobExpiredError("dropped unrun: fetched after its expiry")
        abandoned = functools.partial(self.in_flight.wait_abandoned, slot)
        if results.TTL in job:
            results.failed(self.config, job, gone, "dropped", abandoned)
        batch.failed(self.config, job, gone, "dropped", abandoned)
        time_limits.drop_expired(self.config, job, work, self.fetch, self.counters, expiry=expiry)
        self.in_flight.finish(slot)
        unique.finished(self.config, job, "dropped")  # never ran: a new push may go ahead
        return True

    def _execute(self, job: dict[str, Any], queue: str,
                 entry: Registered | None) -> BaseException | None:
        try:
            if "profile" in job:  # Sidekiq 8's contract; the one check an ordinary job pays
                return profiler.profiled(self.config, job,
                                         lambda: self._run_job(job, queue, entry))
            return self._run_job(job, queue, entry)
        except BaseException as exc:  # noqa: BLE001 - a profiler or metrics error: outcome unknown
            log.error("job.run_error", jid=_jid(job), error=describe(exc))
            return exc

    def _run(self, job: dict[str, Any], queue: str,
             entry: Registered | None) -> BaseException | None:
        context = {"jid": _jid(job), "class": job["class"], "queue": queue, "tid": wlog.tid()}
        # Decided once per job: with info lines off, a job pays no logging at all.
        lines = joblog.job_lines(log, context)
        if lines is not None:
            lines.start()
        started = time.perf_counter()
        try:
            if entry is None:
                raise UnknownJobError.for_name(job["class"])
            perform = entry.factory(job)
            if entry.coroutine:  # on the process's event loop, this thread waiting
                perform = aio.blocking(perform)
            if results.TTL in job:
                perform = results.capturing(perform)
            middleware.invoke(self.config.server_middleware, job, queue,
                              lambda: perform(*job["args"]))
        except BaseException as exc:
            if reschedulable(exc, job):
                return exc  # not a failure: _rescheduled logs it as job.over_limit
            # The traceback goes with the line: JSON's "exception" field, or
            # a readable traceback on a terminal (or in the app's logging).
            log.warning("job.fail", elapsed=round(time.perf_counter() - started, 6),
                        error=describe(exc), exc_info=exc, **context)
            return exc
        if lines is not None:
            lines.done(round(time.perf_counter() - started, 6))
        return None

    def _succeeded(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                   send: Sender | None = None) -> None:
        if results.TTL in job:
            results.succeeded(self.config, job, lambda t: self.in_flight.wait_abandoned(slot, t))
        # Counted in its batch before the ack: a crash between runs it again, counted once.
        if not batch.succeeded(self.config, job, lambda wait: self.in_flight.wait_abandoned(
                slot, wait)):
            self.in_flight.finish(slot)
            return  # a hard stop took it first: its copy stays for the recovery
        if self.in_flight.finish(slot):
            return  # requeued by a hard stop: not ours to settle any more
        self.counters.record(failed=False)
        self.fetch.acknowledge(work, _jid(job), send=send)
        unique.finished(self.config, job, "success")

    def _failed(self, job: dict[str, Any], work: UnitOfWork, slot: str, exc: BaseException,
                entry: Registered | None) -> None:
        if self.in_flight.abandoned(slot):
            return  # as above; the slot stays recorded while the failure settles
        if self._rescheduled(job, work, slot, exc):
            return
        self.counters.record(failed=True)
        for handler in self.config.error_handlers:
            try:
                handler(exc, {"job": job, "queue": work.queue})
            except BaseException as hook_error:  # noqa: BLE001
                log.warning("error_handler.failed", error=describe(hook_error), jid=_jid(job))
        try:
            settlement = self.retry.plan(job, work.queue, exc, entry.options if entry else None)
        except BaseException as unwritable:  # noqa: BLE001 - e.g. a middleware left a non-JSON value
            log.error("retry.unrecordable", jid=_jid(job), error=describe(unwritable),
                      failure=describe(exc))
            settlement = Settlement.dead(work.raw)
        if results.TTL in job:
            results.failed(self.config, job, exc, settlement.outcome,
                           lambda t: self.in_flight.wait_abandoned(slot, t))
        batch.failed(self.config, job, exc, settlement.outcome,
                     lambda wait: self.in_flight.wait_abandoned(slot, wait))
        if self._settle(work, slot, _jid(job), settlement):
            log.info(f"job.{settlement.outcome}", jid=_jid(job), queue=work.queue,
                     retry_count=job.get("retry_count"))
            unique.finished(self.config, job, settlement.outcome)

    def _rescheduled(self, job: dict[str, Any], work: UnitOfWork, slot: str,
                     exc: BaseException) -> bool:
        """Over a limit: back to ``schedule`` with no retry spent (``wurk.runtime.overlimit``)."""
        try:
            settlement = overlimit.plan(self.config, job, work.queue, exc, rng=self.retry.rng)
        except BaseException as unwritable:  # noqa: BLE001 - fails as an ordinary error instead
            log.error("limiter.unreschedulable", jid=_jid(job), error=describe(unwritable))
            return False
        if settlement is None:
            return False
        self.counters.record(failed=False)
        if self._settle(work, slot, _jid(job), settlement):
            log.info("job.over_limit", jid=_jid(job), queue=work.queue,
                     overrated=job["overrated"], at=round(settlement.at, 3))
        return True

    def _malformed(self, work: UnitOfWork, slot: str, reason: str) -> None:
        log.error("job.malformed", queue=work.queue, error=reason,
                  payload=work.raw[:200].decode("utf-8", "replace"))
        if not self.in_flight.begin(slot, work, {}):
            self._requeue_or_report(work)
            return
        self._settle(work, slot, None, Settlement.dead(work.raw))
        self.in_flight.finish(slot)

    def _settle(self, work: UnitOfWork, slot: str, jid: str | None,
                settlement: Settlement) -> bool:
        return settle.until_settled(
            self.config, self.fetch, work, settlement, jid=jid, rng=self.retry.rng,
            abandoned=lambda wait: self.in_flight.wait_abandoned(slot, wait))

    def _requeue_or_report(self, work: UnitOfWork) -> None:
        try:
            self.fetch.requeue([work])
        except Exception as redis_error:  # noqa: BLE001
            log.error("job.lost", queue=work.queue, error=repr(redis_error),
                      payload=work.raw[:200].decode("utf-8", "replace"))


def _jid(job: dict[str, Any]) -> str | None:
    """The jid if it is a string: anything else from Redis is not worth a log field."""
    jid = job.get("jid")
    return jid if isinstance(jid, str) else None

"""The processor: runs one fetched unit of work from raw bytes to ack.

Duties, in order, for each job:
1. Parse, or kill: a payload that is not a job object goes to ``dead`` as the
   raw string, with no retry and no failure count (as Sidekiq does).
2. Resolve the class through the registry only; an unknown name is an
   ordinary failure, so it retries and finally dies.
3. Run it inside the server middleware chain, timing it and logging one line
   at start and one at the end; under cProfile when the payload asks for a
   profile (``wurk.profiler``), and timed and counted while metrics are on
   (``wurk.metrics``). With both off the run path is unchanged.
4. On failure: count it, call the error handlers, hand it to the retry
   handler. On success: count it.
5. Acknowledge, unless the launcher already pushed the job back to Redis
   during a hard stop (then this execution's outcome is dropped: the job
   runs again, which the at-least-once contract allows).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk import logging as wlog
from wurk import metrics, middleware, profiler
from wurk.job import Registered, Registry, UnknownJobError
from wurk.logging import get_logger
from wurk.payload import PayloadError, loads_job
from wurk.retry import RetryHandler, kill

if TYPE_CHECKING:
    from wurk.config import Config
    from wurk.fetch import Fetch, UnitOfWork
    from wurk.manager import Counters, InFlightTable

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
        # Metrics on: every run is timed and counted. Off: the plain method, nothing added.
        observed = metrics.for_config(config)
        self._run_job: RunJob = self._run if observed is None else observed.timed(self._run)

    def process(self, work: UnitOfWork, slot: str) -> None:
        try:
            job = loads_job(work.raw)
        except PayloadError as exc:
            log.error("job.malformed", queue=work.queue, error=str(exc),
                      payload=work.raw[:200].decode("utf-8", "replace"))
            kill(self.config, work.raw)
            self.fetch.acknowledge(work, None)
            return
        if not self.in_flight.begin(slot, work, job):
            # Fetched after a hard stop gave up waiting: hand it straight back.
            self._requeue_or_report(work)
            return
        entry = self.registry.find(job["class"])
        if "profile" in job:  # Sidekiq 8's contract; the one check an ordinary job pays
            failure = profiler.profiled(self.config, job,
                                        lambda: self._run_job(job, work.queue, entry))
        else:
            failure = self._run_job(job, work.queue, entry)
        if self.in_flight.finish(slot):
            return  # requeued by a hard stop: not ours to settle any more
        if failure is None:
            self.counters.record(failed=False)
        else:
            self.counters.record(failed=True)
            self._failed(job, work, failure, entry)
        jid = job.get("jid")
        self.fetch.acknowledge(work, jid if isinstance(jid, str) else None)

    def _run(self, job: dict[str, Any], queue: str,
             entry: Registered | None) -> BaseException | None:
        context = {"jid": job.get("jid"), "class": job["class"], "queue": queue}
        # Checked once per job: with info lines off, a job pays no logging at all.
        chatty = wlog.enabled("info")
        if chatty:
            log.info("job.start", **context)
        started = time.perf_counter()
        try:
            if entry is None:
                raise UnknownJobError.for_name(job["class"])
            perform = entry.factory(job)
            middleware.invoke(self.config.server_middleware, job, queue,
                              lambda: perform(*job["args"]))
        except Exception as exc:  # noqa: BLE001 - a job's failure is data, not a crash
            log.warning("job.fail", elapsed=round(time.perf_counter() - started, 6),
                        error=f"{type(exc).__name__}: {exc}", **context)
            return exc
        if chatty:
            log.info("job.done", elapsed=round(time.perf_counter() - started, 6), **context)
        return None

    def _failed(self, job: dict[str, Any], work: UnitOfWork, exc: BaseException,
                entry: Registered | None) -> None:
        queue = work.queue
        for handler in self.config.error_handlers:
            try:
                handler(exc, {"job": job, "queue": queue})
            except Exception as hook_error:  # noqa: BLE001
                log.warning("error_handler.failed", error=repr(hook_error), jid=job.get("jid"))
        try:
            outcome = self.retry.handle(job, queue, exc, entry.options if entry else None)
        except Exception as redis_error:  # noqa: BLE001
            # The failure could not be recorded; put the job back as fetched
            # rather than drop it (it may run once more than its budget says).
            log.error("retry.write_failed", jid=job.get("jid"), error=repr(redis_error))
            self._requeue_or_report(work)
            return
        log.info("job.retry" if outcome == "retry" else f"job.{outcome}",
                 jid=job.get("jid"), queue=queue, retry_count=job.get("retry_count"))

    def _requeue_or_report(self, work: UnitOfWork) -> None:
        try:
            self.fetch.requeue([work])
        except Exception as redis_error:  # noqa: BLE001
            log.error("job.lost", queue=work.queue, error=repr(redis_error),
                      payload=work.raw[:200].decode("utf-8", "replace"))

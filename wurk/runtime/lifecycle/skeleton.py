"""The skeleton every job's run goes through, whichever executor drives it.

A run is: decode (or kill a payload that is no job), admit, start, perform,
then settle as a success (the acknowledgement), a retry or dead (the atomic
settle, ``wurk.runtime.settle``), a reschedule, or dropped unrun. The
features take part as :class:`~wurk.runtime.lifecycle.step.Step` objects,
passed in at construction; this module names none of them. The executors
(``wurk.runtime.processor`` for threads, ``wurk.runtime.aio_processor`` for
asyncio) are thin drivers: each runs the job's code its own way and calls
these methods in order, so both settle every job the same way.

What the skeleton itself owns, because every job has it:
1. Malformed payloads go to ``dead`` as the raw bytes, with the reason beside
   them (no retry, no failure count, as Sidekiq does).
2. One ``job.start`` and one outcome line per run (``job.done``,
   ``job.fail``; a step that settled the run itself says its own).
3. Failures: counted, handed to the error handlers, planned by the retry
   handler (Sidekiq's retry contract), written with the atomic settle,
   retried through Redis trouble; a failure that cannot be serialised sends
   the raw payload to ``dead``.
4. A job that ends with ``JobCancelled`` (a person's cancel,
   ``wurk.runtime.cancelling``) ends "cancelled": acknowledged, no retry,
   no dead entry, one ``job.cancelled`` line.
5. A hard stop that took the job back wins: this run's outcome is dropped
   and its copy stays for the stop's release or the reaper.

Nothing a job or Redis does makes these methods raise; anything that still
does is a bug of ours, left to the manager's guard, which gives the job back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from wurk.core import joblog
from wurk.core.job_errors import JobCancelled
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import trouble_backoff
from wurk.redis.runtime import Runtime, handed
from wurk.runtime import settle
from wurk.runtime.lifecycle import writes
from wurk.runtime.lifecycle.step import (
    NO_STEPS,
    SUCCESS,
    AsyncCall,
    Call,
    Ending,
    Plan,
    Run,
    Step,
    overrides,
)
from wurk.runtime.lifecycle.writes import Write
from wurk.runtime.work import Sender, Settlement
from wurk.wire.payload import PayloadError, loads_job

if TYPE_CHECKING:
    from wurk.core.joblog import JobLines
    from wurk.push.job import Registered, Registry
    from wurk.push.options import JobOptions
    from wurk.runtime.inflight import Counters, InFlightTable
    from wurk.runtime.retry import RetryHandler
    from wurk.runtime.work import Fetch, UnitOfWork
    from wurk.settings.config import Config

log = get_logger("wurk.processor")


class Lifecycle:
    def __init__(self, config: Config, registry: Registry, fetch: Fetch, counters: Counters,
                 in_flight: InFlightTable, *, retry: RetryHandler, steps: Iterable[Step],
                 runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.registry = registry
        self.fetch = fetch
        self.counters = counters
        self.in_flight = in_flight
        self.retry = retry
        self.steps = tuple(steps)
        # A job's steps as a bit mask: those a payload field calls in are
        # found with dict lookups, the others are asked, and a plan is made
        # once per mask.
        bits = {step: 1 << index for index, step in enumerate(self.steps)}
        self._by_field = [(name, bits[step]) for step in self.steps
                          if not step.every_job and not overrides(step, "applies")
                          for name in step.triggers]
        self._asking = [(step, bits[step]) for step in self.steps
                        if not step.every_job and overrides(step, "applies")]
        self._always = sum(bits[step] for step in self.steps if step.every_job)
        self._plans: dict[int, Plan] = {0: NO_STEPS}
        self._backoff = trouble_backoff(config.redis_retry_base, config.redis_retry_cap)
        self._failure_steps = [step for step in self.steps
                               if overrides(step, "excuses") or overrides(step, "took")
                               or overrides(step, "reschedule")]

    # -- decode and admit ---------------------------------------------------

    def open(self, work: UnitOfWork, slot: str) -> Run | None:
        """The run of a fetched job, or None when it was dealt with here
        (malformed: to dead; fetched after a hard stop gave up: handed back)."""
        try:
            job = loads_job(work.raw)
        except PayloadError as exc:
            self.malformed(work, slot, str(exc))
            return None
        if not self.in_flight.begin(slot, work, job):
            self.requeue_or_report(work)
            return None
        entry = self.registry.find(job["class"])
        return Run(job, work, slot, entry, self.in_flight, self.plan_for(job, entry))

    def begin(self, work: UnitOfWork, slot: str, job: dict[str, Any], entry: Registered,
              plan: Plan) -> Run | None:
        """The run of a job already decoded and looked up (the asyncio executor's),
        or None when a hard stop gave up waiting: the caller hands it back."""
        if not self.in_flight.begin(slot, work, job):
            return None
        return Run(job, work, slot, entry, self.in_flight, plan)

    def plan_for(self, job: dict[str, Any], entry: Registered | None) -> Plan:
        """The steps this job calls in, per hook."""
        mask = self._always
        for name, bit in self._by_field:
            if name in job:
                mask |= bit
        for step, bit in self._asking:
            if step.applies(job, entry):
                mask |= bit
        plan = self._plans.get(mask)
        if plan is None:
            plan = self._plans[mask] = Plan.of(
                tuple(step for index, step in enumerate(self.steps) if mask >> index & 1))
        return plan

    def admit(self, run: Run) -> bool:
        """False when a step ended the job unrun (dropped, acknowledged)."""
        for step in run.plan.admit:
            reason = step.admit(run)
            if reason is not None:
                self._drop(run, reason)
                return False
        return True

    def _drop(self, run: Run, reason: BaseException) -> None:
        # Its steps learn it will never run before the ack: a crash between
        # leaves it to be fetched, and dropped, again.
        ending = Ending("dropped", reason)
        self._concluding(run, ending)
        self.counters.record(failed=False)
        self.fetch.acknowledge(run.work, run.jid)
        self.in_flight.finish(run.slot)
        self._concluded(run, ending)

    # -- around the job's code ----------------------------------------------

    def start(self, run: Run) -> None:
        for step in run.plan.start:
            step.start(run)

    def enter(self, run: Run) -> None:
        for step in run.plan.enter:
            step.enter(run)

    def exit(self, run: Run) -> None:
        for step in run.plan.exit:
            step.exit(run)

    def around(self, run: Run, call: Call) -> Call:
        for step in run.plan.around:
            call = step.around(run, call)
        return call

    def around_async(self, run: Run, call: AsyncCall) -> AsyncCall:
        for step in run.plan.around_async:
            call = step.around_async(run, call)
        return call

    def lines(self, run: Run, tid: Any) -> JobLines | None:
        """The run's start line, said now; the object that says its end."""
        context = {"jid": run.jid, "class": run.job["class"], "queue": run.queue, "tid": tid}
        # Decided once per job: with info lines off, a job pays no logging at all.
        lines = joblog.job_lines(log, context)
        if lines is not None:
            lines.start()
        return lines

    def ran(self, run: Run, lines: JobLines | None, failure: BaseException | None,
            started: float, tid: Any) -> None:
        """The run's figures and its one outcome line."""
        elapsed = time.perf_counter() - started
        # A cancel is no failure: its one line is said as it settles (job.cancelled).
        excused = failure is not None and (isinstance(failure, JobCancelled) or any(
            step.excuses(run, failure) for step in self._failure_steps))
        for step in run.plan.observe:
            try:
                step.observe(run, elapsed, failure is not None and not excused)
            except BaseException as exc:  # noqa: BLE001 - a figure never touches the job
                log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")
        if failure is None:
            if lines is not None:
                lines.done(round(elapsed, 6))
            return
        if excused:
            return  # not a failure: the step that excused it says what became of it
        context = {"jid": run.jid, "class": run.job["class"], "queue": run.queue, "tid": tid}
        if any(step.took(run, failure) for step in self._failure_steps):
            log.debug("job.unwound", elapsed=round(elapsed, 6), **context)
            return
        # The traceback goes with the line: JSON's "exception" field, or a
        # readable traceback on a terminal (or in the app's logging).
        log.warning("job.fail", elapsed=round(elapsed, 6), error=describe(failure),
                    exc_info=failure, **context)

    # -- settle ---------------------------------------------------------------

    def succeeded(self, run: Run, send: Sender | None = None) -> None:
        plan = run.plan
        if plan.concluding and self.in_flight.abandoned(run.slot):
            # A hard stop (or the job timer) took it back: its next run writes what
            # this one would have, and its lock must hold for that run.
            self.in_flight.finish(run.slot)
            return
        if plan.concluding and not self._concluding(run, SUCCESS):
            self.in_flight.finish(run.slot)
            return  # a hard stop took it first: its copy stays for the recovery
        if self.in_flight.finish(run.slot):
            return  # requeued by a hard stop: not ours to settle any more
        self.counters.record(failed=False)
        self.fetch.acknowledge(run.work, run.jid, send=send)
        if plan.concluded:
            self._concluded(run, SUCCESS)

    def failed(self, run: Run, failure: BaseException) -> None:
        """Settle a failure, then free the slot."""
        self._failed(run, failure)
        self.in_flight.finish(run.slot)

    def _failed(self, run: Run, failure: BaseException) -> None:
        if self.in_flight.abandoned(run.slot):
            return  # as above; the slot stays recorded while the failure settles
        if isinstance(failure, JobCancelled):
            self._cancelled(run, failure)
            return
        if self._rescheduled(run, failure):
            return
        self.counters.record(failed=True)
        job, jid = run.job, run.jid
        settlement = self._plan(job, run.work, failure, run.options)
        if not self._concluding(run, Ending(settlement.outcome, failure)):
            return  # a hard stop took the job meanwhile: its copy stays for the recovery
        written = self._settle(run.work, run.slot, jid, settlement)
        if written is None:
            return
        ending = self._as_written(run, failure, settlement, written)
        log.info(f"job.{ending.outcome}", jid=jid, queue=run.queue,
                 retry_count=job.get("retry_count"))
        self._concluded(run, ending)

    def _cancelled(self, run: Run, failure: JobCancelled) -> bool:
        """Cancelled by a person (or by the job itself): neither retry nor dead;
        its steps hear a "cancelled" ending (its lock goes, its batch counts a
        death, its result is final), then it is acknowledged, as a drop is."""
        ending = Ending("cancelled", failure)
        if not self._concluding(run, ending):
            return False  # a hard stop took the job meanwhile: its copy stays for the recovery
        self.counters.record(failed=False)
        self.fetch.acknowledge(run.work, run.jid)
        log.info("job.cancelled", jid=run.jid, queue=run.queue, **{"class": run.job["class"]})
        self._concluded(run, ending)
        return True

    def _as_written(self, run: Run, failure: BaseException, planned: Settlement,
                    written: Settlement) -> Ending:
        """The ending as it was written: a job parked in dead instead of its
        planned retry tells its steps again (its batch counts a death, its
        result is final, its lock goes); their writes are safe to repeat."""
        ending = Ending(written.outcome, failure)
        if written.outcome != planned.outcome:
            self._concluding(run, ending)
        return ending

    def overran(self, work: UnitOfWork, failure: BaseException,
                stopped: Callable[[float], bool]) -> bool:
        """Settle a run the job timer took at its hard limit (or a cancel with
        ``--kill`` took), from the payload as fetched (the job's thread may
        still hold its own copy); True once settled."""
        try:
            job = loads_job(work.raw)
        except PayloadError as exc:  # it ran, so it was readable: a bug, but never a loss
            log.error("retry.unrecordable", jid=None, error=describe(exc))
            settled = self._settle(work, "", None, Settlement.unrecordable(work.raw, exc), stopped)
            if settled is not None:
                self.counters.record(failed=True)
            return settled is not None
        entry = self.registry.find(job["class"])
        run = Run(job, work, "", entry, self.in_flight, self.plan_for(job, entry), stopped=stopped)
        if isinstance(failure, JobCancelled):  # ``wurk cancel --kill``: taken as the timer takes
            return self._cancelled(run, failure)
        settlement = self._plan(job, work, failure, run.options)
        self._concluding(run, Ending(settlement.outcome, failure))
        written = self._settle(work, "", run.jid, settlement, stopped)
        if written is None:
            return False
        ending = self._as_written(run, failure, settlement, written)
        self.counters.record(failed=True)
        log.info(f"job.{ending.outcome}", jid=run.jid, queue=work.queue,
                 error=type(failure).__name__)
        self._concluded(run, ending)
        return True

    def _plan(self, job: dict[str, Any], work: UnitOfWork, failure: BaseException,
              options: JobOptions | None) -> Settlement:
        """Error handlers told, then the retry handler's plan for the failure."""
        for handler in self.config.error_handlers:
            try:
                handler(failure, {"job": job, "queue": work.queue})
            except BaseException as hook_error:  # noqa: BLE001
                log.warning("error_handler.failed", error=describe(hook_error),
                            jid=job.get("jid") if isinstance(job.get("jid"), str) else None)
        try:
            return self.retry.plan(job, work.queue, failure, options)
        except BaseException as unwritable:  # noqa: BLE001 - e.g. a middleware left a non-JSON value
            jid = job.get("jid")
            log.error("retry.unrecordable", jid=jid if isinstance(jid, str) else None,
                      error=describe(unwritable), failure=describe(failure))
            return Settlement.unrecordable(work.raw, unwritable)

    def _rescheduled(self, run: Run, failure: BaseException) -> bool:
        """A step took the failure as a reschedule: no retry spent."""
        for step in self._failure_steps:
            settlement = step.reschedule(run, failure)
            if settlement is None:
                continue
            self.counters.record(failed=False)
            written = self._settle(run.work, run.slot, run.jid, settlement)
            if written is None:
                return True
            if written.outcome == settlement.outcome:
                step.concluded(run, Ending(settlement.outcome, failure))
                return True
            ending = self._as_written(run, failure, settlement, written)  # parked in dead
            log.info(f"job.{ending.outcome}", jid=run.jid, queue=run.queue,
                     retry_count=run.job.get("retry_count"))
            self._concluded(run, ending)
            return True
        return False

    def _concluding(self, run: Run, ending: Ending) -> bool:
        """Every step's writes for this ending, sent together until they land;
        False when a hard stop took the job first."""
        found: list[Write] = []
        for step in run.plan.concluding:
            try:
                found.extend(step.concluding(run, ending))
            except Exception as exc:  # noqa: BLE001 - a step's bug: its writes are lost, not the job
                log.error("step.failed", step=step.name, hook="concluding", jid=run.jid,
                          error=describe(exc))
        if not found:
            return True
        return writes.send(self.runtime.pool, found, run.abandoned, self._backoff)

    def _concluded(self, run: Run, ending: Ending) -> None:
        for step in run.plan.concluded:
            step.concluded(run, ending)

    def malformed(self, work: UnitOfWork, slot: str, reason: str) -> None:
        log.error("job.malformed", queue=work.queue, error=reason,
                  payload=work.raw[:200].decode("utf-8", "replace"))
        if not self.in_flight.begin(slot, work, {}):
            self.requeue_or_report(work)
            return
        self._settle(work, slot, None, Settlement.dead(work.raw,
                                                       reason=("PayloadError", reason)))
        self.in_flight.finish(slot)

    def _settle(self, work: UnitOfWork, slot: str, jid: str | None, settlement: Settlement,
                stopped: Callable[[float], bool] | None = None) -> Settlement | None:
        """What was written: ``settlement``, the dead entry that parked a job
        whose entry could not be written, or None (a stop took it, or it was gone)."""
        return settle.until_settled(
            self.config, self.fetch, work, settlement, jid=jid, rng=self.retry.rng,
            abandoned=stopped or (lambda wait: self.in_flight.wait_abandoned(slot, wait)))

    def requeue_or_report(self, work: UnitOfWork) -> None:
        try:
            self.fetch.requeue([work])
        except Exception as redis_error:  # noqa: BLE001
            log.error("job.lost", queue=work.queue, error=repr(redis_error),
                      payload=work.raw[:200].decode("utf-8", "replace"))

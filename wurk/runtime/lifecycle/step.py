"""A job's run and the steps that features register on it.

Every job goes through one fixed skeleton (``wurk.runtime.lifecycle.skeleton``):
decode, admit, start, perform, and settle as a success, a retry, dead or
dropped. A feature (unique locks, batches, results, expiry, profiles,
metrics, time limits, limiters ...) takes part through a :class:`Step`:
an object whose hooks the skeleton calls at those points. A step says which
jobs call it in (:attr:`Step.triggers`, or :meth:`Step.applies`), so a job
that uses no feature pays a few dict lookups and no hook at all.

The hooks, in the order a run meets them (each default does nothing):

``admit``      before anything runs: an error to end the job unrun
               ("dropped"), or None. May do I/O.
``start``      before the job's middleware; may do I/O (the asyncio
               executor calls it off the event loop).
``enter``      on the thread or task that runs the job, around it with
               ``exit``: context a job's code sees (a context variable).
``around``     wraps the whole threaded execution (a profiler, the job
               timer); the asyncio executor's twin is ``around_async``.
``excuses``    a failure that is no failure (a limiter's reschedule): no
               ``job.fail`` line, not counted as failed.
``took``       a failure whose outcome the step already settled and
               logged (a hard time limit): the skeleton logs no second one.
``observe``    the run's duration and whether it failed (metrics).
``reschedule`` claims a failure as a reschedule: the settlement to write.
``concluding`` before the ack or settle, for a success, retry, dead,
               dropped or cancelled: what the ending means for the feature's own keys,
               as Redis writes (``wurk.runtime.lifecycle.writes``) the
               skeleton sends with every other step's in one round trip.
``concluded``  after the ack or settle landed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wurk.push.job import Registered
    from wurk.push.options import JobOptions
    from wurk.runtime.inflight import InFlightTable
    from wurk.runtime.lifecycle.writes import Write
    from wurk.runtime.work import Settlement, UnitOfWork

Call = Callable[[], Any]
AsyncCall = Callable[[], Awaitable[Any]]
# A job's middleware skipped it: no value came back.
SKIPPED: Any = object()


@dataclass(slots=True, eq=False)
class Run:
    """One job's run, as the skeleton and its steps see it."""

    job: dict[str, Any]
    work: UnitOfWork
    slot: str
    entry: Registered | None
    in_flight: InFlightTable
    # The steps this job called in, by hook.
    plan: Plan
    value: Any = SKIPPED
    # Each step's own state for this run, under its name.
    notes: dict[str, Any] = field(default_factory=dict)
    # Set for a run whose slot the job timer took: its own stop waiter.
    stopped: Callable[[float], bool] | None = None
    # The jid if it is a string: anything else from Redis is not worth a log field.
    jid: str | None = field(init=False)

    def __post_init__(self) -> None:
        jid = self.job.get("jid")
        self.jid = jid if isinstance(jid, str) else None

    def abandoned(self, wait: float) -> bool:
        """Wait up to ``wait`` seconds for a hard stop; True once one took the job."""
        if self.stopped is not None:
            return self.stopped(wait)
        return self.in_flight.wait_abandoned(self.slot, wait)

    @property
    def queue(self) -> str:
        return self.work.queue

    @property
    def options(self) -> JobOptions | None:
        return self.entry.options if self.entry is not None else None


@dataclass(frozen=True, slots=True)
class Ending:
    """How a run ended: ``outcome`` is "success", "retry", "dead", "dropped" or
    "cancelled" (a person's cancel: it will not run again, as "dead", but
    nothing goes to the dead set)."""

    outcome: str
    failure: BaseException | None = None


SUCCESS = Ending("success")


class Step:
    """A feature's part in every job's run; see the module docstring for the hooks."""

    name = "step"
    # Payload fields that call this step in; an empty tuple with ``every_job``.
    triggers: tuple[str, ...] = ()
    every_job = False
    # The job must run on a thread (the asyncio executor then does not run it natively).
    needs_thread = False

    def applies(self, job: dict[str, Any], entry: Registered | None) -> bool:
        if self.every_job:
            return True
        return any(name in job for name in self.triggers)

    def admit(self, run: Run) -> BaseException | None:
        return None

    def start(self, run: Run) -> None:
        return None

    def enter(self, run: Run) -> None:
        return None

    def exit(self, run: Run) -> None:
        return None

    def around(self, run: Run, call: Call) -> Call:
        return call

    def around_async(self, run: Run, call: AsyncCall) -> AsyncCall:
        return call

    def excuses(self, run: Run, failure: BaseException) -> bool:
        return False

    def took(self, run: Run, failure: BaseException) -> bool:
        return False

    def observe(self, run: Run, elapsed: float, failed: bool) -> None:
        return None

    def reschedule(self, run: Run, failure: BaseException) -> Settlement | None:
        return None

    def concluding(self, run: Run, ending: Ending) -> Sequence[Write]:
        return ()

    def concluded(self, run: Run, ending: Ending) -> None:
        return None


HOOKS = ("admit", "start", "enter", "exit", "around", "around_async", "observe",
         "concluding", "concluded")


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps one kind of job calls in, per hook, each in the order it runs.

    Made once per combination of steps and kept: a run only looks its plan up.
    """

    steps: tuple[Step, ...]
    admit: tuple[Step, ...]
    start: tuple[Step, ...]
    enter: tuple[Step, ...]
    exit: tuple[Step, ...]  # innermost first
    around: tuple[Step, ...]  # innermost first: each wraps the call made so far
    around_async: tuple[Step, ...]
    observe: tuple[Step, ...]
    concluding: tuple[Step, ...]
    concluded: tuple[Step, ...]
    needs_thread: bool

    @classmethod
    def of(cls, steps: tuple[Step, ...]) -> Plan:
        def using(hook: str) -> tuple[Step, ...]:
            return tuple(step for step in steps if overrides(step, hook))

        inside_out = ("exit", "around", "around_async")
        hooks = {hook: using(hook)[::-1] if hook in inside_out else using(hook)
                 for hook in HOOKS}
        return cls(steps, needs_thread=any(step.needs_thread for step in steps), **hooks)

    @property
    def settles(self) -> bool:
        """Whether a success has more to write than its acknowledgement."""
        return bool(self.concluding or self.concluded)


NO_STEPS = Plan.of(())


def overrides(step: Step, hook: str) -> bool:
    """Whether ``step`` has its own ``hook`` (the skeleton skips the defaults)."""
    return getattr(type(step), hook) is not getattr(Step, hook)

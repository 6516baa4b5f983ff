"""What both executors' managers hold: the fetch, the job lifecycle and its parts.

The threads :class:`~wurk.runtime.manager.Manager` and the asyncio
:class:`~wurk.runtime.aio_manager.AsyncManager` each own one :class:`Crew`
and drive it their own way (processor threads; feeder threads and an event
loop); both are a :class:`CrewDriver`, which holds the crew and names its
parts, and neither is built from the other.

Duties:
1. Build, from a config and the process's runtime, the parts a worker's jobs
   pass through: the fetch (basic, or reliable with private lists), the
   in-flight table and counters (:mod:`wurk.runtime.inflight`) the heartbeat
   publishes, the retry handler, the soft and hard time-limit timer, the job
   lifecycle with its steps (:mod:`wurk.runtime.steps`) and the threads
   executor's :class:`~wurk.runtime.processor.Processor`.
2. The quiet flag: :meth:`quiet` stops fetching; the driver's loops watch it.
3. :meth:`give_back`: requeue the job a slot still holds (or the one a loop
   was handed), unless a hard stop already did; a requeue that fails is
   logged with the payload (``job.lost``), never raised.
4. :meth:`requeue`: push back, in one pipeline, the jobs a stop found still
   running.
5. :meth:`drain_fetches`: wait, within the pool's drain deadline, for the
   driver's threads still blocked in a fetch, whose result they push back.
6. :meth:`kill`: ``wurk cancel --kill`` takes a job's runs from their threads
   and settles them as cancelled, as the job timer does past a hard limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wurk.core import logging as wlog
from wurk.core import threads
from wurk.core.job_errors import JobCancelled
from wurk.core.logging import get_logger
from wurk.redis.runtime import Runtime, handed
from wurk.runtime.cancelling import CancelStep
from wurk.runtime.fetch import BasicFetch
from wurk.runtime.inflight import Counters, InFlightTable, Running
from wurk.runtime.job_timer import JobTimer
from wurk.runtime.lifecycle.skeleton import Lifecycle
from wurk.runtime.processor import Processor
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.runtime.retry import RetryHandler
from wurk.runtime.steps import job_steps
from wurk.runtime.work import Fetch, UnitOfWork

if TYPE_CHECKING:
    from wurk.push.job import Registry
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.manager")


class Crew:
    """One process's fetch, lifecycle and in-flight state; see the module docstring."""

    def __init__(self, config: Config, plan: QueuePlan, registry: Registry,
                 identity: str, *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.counters = Counters()
        self.in_flight = InFlightTable()
        self.fetch: Fetch = (
            ReliableFetch(config, plan, identity, runtime=self.runtime) if config.reliable_fetch
            else BasicFetch(config, plan, runtime=self.runtime))
        self.retry = RetryHandler(config, runtime=self.runtime)
        # Soft and hard time limits; its thread starts with the first bounded job.
        self.timer = JobTimer(self.in_flight, overran=self._overran)
        # Which thread or task runs which jid, for a person's cancel (the launcher's watch).
        self.cancels = CancelStep()
        steps = job_steps(self.runtime, self.counters, self.timer, self.retry.rng, self.cancels)
        self.lifecycle = Lifecycle(config, registry, self.fetch, self.counters, self.in_flight,
                                   retry=self.retry, steps=steps, runtime=self.runtime)
        self.processor = Processor(self.lifecycle)
        self.quiet_flag = threading.Event()
        # The driver's threads (processors, or feeders): a stop joins them.
        self.threads: list[threading.Thread] = []

    def kill(self, jid: str) -> bool:
        """``wurk cancel --kill``: settle the runs of ``jid`` as cancelled now, taken
        from their threads as the job timer takes a job past its hard limit
        (whatever they come back with is dropped); True if one was taken: the
        caller recycles the process."""
        taken = [work for slot, work in self.cancels.runs_of(jid)
                 if self.in_flight.take_over(slot, work) is not None]
        for work in taken:
            threading.Thread(target=self.lifecycle.overran, name="wurk-cancel-kill", daemon=True,
                             args=(work, JobCancelled("cancelled by a person (--kill)"),
                                   self.timer.service.wait)).start()
        return bool(taken)

    def _overran(self, work: UnitOfWork, failure: BaseException,
                 stopped: Callable[[float], bool]) -> bool:
        # Bound late: the timer exists before the lifecycle, whose steps it serves.
        return self.lifecycle.overran(work, failure, stopped)

    @property
    def quieting(self) -> bool:
        return self.quiet_flag.is_set()

    def quiet(self) -> None:
        self.quiet_flag.set()
        self.fetch.quiet()

    def give_back(self, slot: str, work: UnitOfWork | None) -> None:
        """Requeue the job this slot still holds (else ``work``), unless a hard stop did.

        It may have run in part: at least once, as after a hard stop.
        """
        running = self.in_flight.take(slot)
        if running is not None:
            if running.abandoned:
                return
            work = running.work
        if work is None:
            return
        try:
            self.fetch.requeue([work])
        except BaseException as error:  # noqa: BLE001 - the log line keeps the job
            log.error("job.lost", queue=work.queue, error=threads.describe(error),
                      payload=work.raw.decode("utf-8", "replace"))
            return
        log.warning("processor.requeued", queue=work.queue)

    def requeue(self, leftovers: list[Running]) -> int:
        """Push back what a stop found still running; how many went back."""
        if not leftovers:
            return 0
        jids = [r.job.get("jid") for r in leftovers]
        try:
            self.fetch.requeue([r.work for r in leftovers])
        except Exception as exc:  # noqa: BLE001
            log.error("shutdown.requeue_failed", jobs=len(leftovers), jids=jids, error=repr(exc))
            return 0
        log.warning("shutdown.requeued", jobs=len(leftovers), jids=jids)
        return len(leftovers)

    def drain_fetches(self) -> None:
        """Wait for idle threads still blocked in BRPOP (a deadline shorter than
        ``fetch_timeout``). Whatever such a fetch returns, a requeued job
        included, its thread pushes back; the process must not exit before.
        """
        running = self.in_flight.slots()
        # Their BRPOPs end by the pool's deadline during a drain, and so does this wait.
        wait = self.runtime.pool.deadline.clip(self.config.fetch_timeout
                                              + self.config.redis_read_timeout)
        limit = time.monotonic() + (wait or 0.0)
        for thread in self.threads:
            if thread.native_id is not None and wlog.base36(thread.native_id) not in running:
                thread.join(max(0.0, limit - time.monotonic()))


class CrewDriver:
    """What both managers share: the crew they drive, its parts under the names
    the launcher and the heartbeat use, and the verbs that are the crew's own."""

    def __init__(self, config: Config, plan: QueuePlan, registry: Registry,
                 identity: str, *, runtime: Runtime | None = None) -> None:
        crew = self.crew = Crew(config, plan, registry, identity, runtime=runtime)
        self.config, self.runtime, self.fetch = crew.config, crew.runtime, crew.fetch
        self.counters, self.in_flight, self.retry = crew.counters, crew.in_flight, crew.retry
        self.timer, self.lifecycle, self.processor = crew.timer, crew.lifecycle, crew.processor
        self.cancels = crew.cancels
        self._quiet, self._threads = crew.quiet_flag, crew.threads

    @property
    def quieting(self) -> bool:
        return self.crew.quieting

    def quiet(self) -> None:
        self.crew.quiet()

    def kill(self, jid: str) -> bool:
        """``wurk cancel --kill`` (see :meth:`Crew.kill`)."""
        return self.crew.kill(jid)

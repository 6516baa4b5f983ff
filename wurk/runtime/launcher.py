"""The launcher: starts and stops one worker process's parts, in order.

Duties:
1. ``start``: the health listener if configured (its port goes into the
   heartbeat info), then the heartbeat (so the process is visible before it
   takes work), then the processor threads, then the scheduler poller,
   then the spool drainer (pushes what exited processes spooled, at start
   and every ``spool_interval``), then, when asked (``wurk run``, never a
   swarm child) and periodic entries are declared, the periodic loop
   (:mod:`wurk.runtime.periodic`), stopped first on the way out. Every
   one of those threads runs under :mod:`wurk.core.threads`: one that
   dies is logged, restarted, and fails ``/live`` until it is.
2. ``quiet``: stop fetching, the poller and the spool drainer; running jobs
   carry on.
3. ``stop(deadline)``: quiet, let running jobs finish until the monotonic
   deadline, push the unfinished back to their queues, then say goodbye in
   the heartbeat (flush stats, leave ``processes``) and close the listener.
   Every Redis wait of the stop, and of every thread still running, ends by
   the deadline plus :data:`STOP_MARGIN` (the pool's deadline): with Redis
   unreachable, the jobs that cannot be given back stay in the private
   lists (the reaper or the swarm parent gives them back later) and the
   process still exits on time.
4. Route remote signals from the heartbeat: TSTP quiets, TERM asks the
   owner to stop (via ``on_stop_request``), TTIN dumps thread stacks. A job
   past its hard limit asks the same way (``recycle``, unless built with
   ``recycle=False``), and so does the process once it has run its
   ``max_jobs`` (:mod:`wurk.runtime.recycling`) or a job of it was cancelled
   with ``--kill`` (:mod:`wurk.runtime.cancelling`); ``recycled`` tells the
   owner why it stopped, ``overran`` whether a job was taken from its thread.
   ``on_pulse`` goes to the heartbeat, called after each beat attempt.
5. :func:`stop_before_exit`, for a process that exits after the stop
   (``wurk run``, a swarm child): stop, then send or spool what the push
   buffers still hold, both within the same drain deadline, then call the
   config's ``on_shutdown`` hooks (:func:`run_shutdown_hooks`).
6. The signal tables such a process serves (:func:`wurk.runtime.signals.serve`):
   :func:`worker_signals` once the launcher runs, :func:`waiting_signals`
   while it waits for Redis. Each process names the signals that stop it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.observe import metrics
from wurk.push.buffered import flush_push_buffers
from wurk.push.job import Registry, registry
from wurk.push.periodic import table as periodic_table
from wurk.push.spool_drain import SpoolDrainer
from wurk.redis.runtime import Runtime, handed
from wurk.runtime import health, recycling
from wurk.runtime.aio_manager import make_manager
from wurk.runtime.cancelling import POLL, CancelWatch
from wurk.runtime.heartbeat import Heartbeat, make_identity
from wurk.runtime.loading import NO_JOBS_HINT, wurks_own
from wurk.runtime.periodic import PeriodicLoop
from wurk.runtime.reaper import RELEASED, Reaper, recover
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.runtime.scheduled import Poller
from wurk.settings.queues import parse_queues
from wurk.wire import kept_writes

if TYPE_CHECKING:
    from wurk.runtime.signals import Action
    from wurk.settings.config import Config

log = get_logger("wurk.launcher")
# Why a process recycles itself (Launcher.recycled).
HARD_TIMEOUT, MAX_JOBS, CANCEL_KILL = "hard_timeout", "max_jobs", "cancel_kill"
# Giving back and goodbyes get this long past the jobs' deadline; a swarm's
# parent waits shutdown_grace (default 5 s) past it before it KILLs.
STOP_MARGIN = 1.0


class Launcher:
    def __init__(self, config: Config, *, jobs: Registry | None = None,
                 on_stop_request: Callable[[], None] | None = None,
                 extra_info: dict[str, Any] | None = None, periodic: bool = False,
                 on_pulse: Callable[[], None] | None = None, recycle: bool = True,
                 runtime: Runtime | None = None) -> None:
        self.config = config
        # Every part gets this one: the pool its I/O goes through is handed down.
        self.runtime = handed(runtime, config)
        self.periodic: PeriodicLoop | None = None
        self._periodic_wanted = periodic
        plan = parse_queues(config.queues)
        identity = make_identity()
        self.jobs = jobs or registry
        self.manager = make_manager(config, plan, self.jobs, identity, runtime=self.runtime)
        self.poller = Poller(config, runtime=self.runtime)
        # A person's cancel of a job running here, read from Redis each POLL seconds.
        self.cancel_watch = CancelWatch(self.manager.cancels, self.runtime, on_kill=self._kill,
                                        poll=min(POLL, config.heartbeat_interval))
        self.spool = SpoolDrainer(config, self.runtime.pool)
        # Reliable fetch's data epoch, kept fresh by the heartbeat and the reaper.
        epoch = self.manager.fetch.epoch if isinstance(self.manager.fetch, ReliableFetch) else None
        self.reaper = Reaper(config, identity, epoch, runtime=self.runtime)
        self.heartbeat = Heartbeat(config, plan, counters=self.manager.counters, epoch=epoch,
                                   in_flight=self.manager.in_flight,
                                   on_signal=self._remote_signal, extra_info=extra_info,
                                   identity=identity, on_pulse=on_pulse, runtime=self.runtime,
                                   on_beat=metrics.beat_reporter(
                                       self.runtime, plan.names,
                                       metrics.process_tags(extra_info or {})))
        self.health: health.HealthServer | None = None
        # A swarm child's index (in extra_info) offsets a fixed health port.
        self._index = int((extra_info or {}).get("index", 0))
        self.on_stop_request = on_stop_request
        self.stopped = threading.Event()
        # Set when a job overran its hard limit and the process recycles itself.
        self.overran = threading.Event()
        # Why the process recycles itself (HARD_TIMEOUT, MAX_JOBS), once it does.
        self.recycled: str | None = None
        self._recycle_lock = threading.Lock()
        # Embedded, nothing would start a new worker: an overrun job is settled
        # as failed and the worker carries on (``recycle=False``), and
        # max_jobs is not counted.
        self.manager.timer.on_overrun = self.recycle if recycle else None
        self.job_limit = recycling.job_limit(config.max_jobs, config.max_jobs_jitter)
        if recycle and self.job_limit is not None:
            budget = recycling.JobBudget(self.job_limit, lambda: self.recycle(MAX_JOBS))
            self.manager.counters.on_record = budget.spend
        self._recycles = recycle
        # Named when a job's class is unknown here: which process lacked it.
        self.manager.retry.identity = identity

    @property
    def identity(self) -> str:
        return self.heartbeat.identity

    def start(self) -> None:
        if self.config.health_listen is not None:
            self.health = health.serve(self.config, self.heartbeat, index=self._index,
                                       runtime=self.runtime)
            self.heartbeat.add_info(health_port=self.health.port)
        # Beat first: a reaper elsewhere must never see our private lists
        # before it can see that we are alive.
        self.heartbeat.start()
        if self.config.reliable_fetch:
            self.reaper.start()
        # Said before the processors start, so it precedes any job's line.
        log.info("launcher.started", identity=self.identity, queues=self.config.queues,
                 concurrency=self.config.concurrency)
        self._report_jobs()
        self.manager.start()
        self.cancel_watch.start()
        self.poller.start()
        self.spool.start()
        if self._periodic_wanted and (entries := periodic_table.entries()):
            self.periodic = PeriodicLoop(self.config, entries, runtime=self.runtime).start()

    def _report_jobs(self) -> None:
        names = self.jobs.names()
        if not [name for name in names if not wurks_own(self.jobs, name)]:
            # The entry points refuse to start so (loading.require_jobs); a
            # Launcher built by hand still says it.
            log.warning("launcher.no_jobs", identity=self.identity, hint=NO_JOBS_HINT)
        else:
            log.debug("launcher.jobs", identity=self.identity, jobs=names)

    def quiet(self) -> None:
        if not self.heartbeat.quiet:
            log.info("launcher.quiet", identity=self.identity)
            self.heartbeat.quiet = True
            self.heartbeat.beat_soon()
        self.manager.quiet()
        self.poller.stop()
        self.spool.stop()

    def stop(self, deadline: float | None = None) -> int:
        """Drain until ``deadline`` (default: now + shutdown_timeout); returns jobs requeued."""
        if deadline is None:
            deadline = time.monotonic() + self.config.shutdown_timeout
        log.info("launcher.stopping", identity=self.identity,
                 timeout=round(max(0.0, deadline - time.monotonic()), 3))
        with self.runtime.pool.deadline.bounded(deadline + STOP_MARGIN):
            return self._stop(deadline)

    def _stop(self, deadline: float) -> int:
        if self.periodic is not None:
            self.periodic.stop()  # gives the lease up for another process at once
        self.quiet()
        requeued = self.manager.stop(deadline)
        self.cancel_watch.stop()
        # Releases Redis refused earlier: one last try, within the stop's bound.
        kept_writes.flush(deadline + STOP_MARGIN)
        self.reaper.stop()
        if self.config.reliable_fetch:
            self._release_private_lists()
        self.heartbeat.stop()
        if self.health is not None:
            self.health.stop()
        self.stopped.set()
        log.info("launcher.stopped", identity=self.identity, requeued=requeued)
        return requeued

    def _release_private_lists(self) -> None:
        """Anything still in our private lists goes back, and we stop owning them."""
        try:
            recover(self.runtime, self.identity, cause=RELEASED)
        except Exception as exc:  # noqa: BLE001 - the reaper elsewhere will do it later
            log.error("launcher.release_failed", error=f"{type(exc).__name__}: {exc}")

    def recycle(self, reason: str = HARD_TIMEOUT) -> None:
        """A job overran its hard limit or was cancelled with ``--kill``, or the
        process ran its ``max_jobs``: stop as
        a TERM would, so the other running jobs finish or go back, and a fresh
        process takes over (the owner says how). Only the first request stops."""
        overrun = reason in (HARD_TIMEOUT, CANCEL_KILL)
        if overrun:
            self.overran.set()
        with self._recycle_lock:
            first = self.recycled is None
            if first:
                self.recycled = reason
        if overrun:
            # Said even when an earlier request (max_jobs) is already stopping
            # the process: an operator looks for why a job was taken.
            log.warning("launcher.recycling", identity=self.identity, reason=reason,
                        **({} if first else {"already": self.recycled}))
        if not first:
            return
        if not overrun:
            log.info("launcher.recycling", identity=self.identity, reason=reason,
                     jobs=self.job_limit)
            # At once, on the thread whose job reached the limit: no thread takes
            # another job while the stop request travels to the owner.
            self.manager.quiet()
        self._remote_signal("TERM")

    def _kill(self, jid: str) -> None:
        """``wurk cancel --kill``: the job is settled as cancelled now; the process
        recycles, as at a hard timeout (an embedded worker carries on)."""
        if self.manager.kill(jid) and self._recycles:
            self.recycle(CANCEL_KILL)

    def _remote_signal(self, name: str) -> None:
        if name == "TSTP":
            self.quiet()
        elif name == "TERM":
            if self.on_stop_request is not None:
                self.on_stop_request()
            else:
                threading.Thread(target=self.stop, name="wurk-remote-stop", daemon=True).start()
        elif name == "TTIN":
            dump_threads()


def stop_before_exit(launcher: Launcher) -> int:
    """Stop, then flush (or spool) the push buffers by the same drain deadline,
    so that a process leaving during a Redis outage still leaves on time."""
    deadline = time.monotonic() + launcher.config.shutdown_timeout
    requeued = launcher.stop(deadline)
    with launcher.runtime.pool.deadline.bounded(deadline + STOP_MARGIN):
        flush_push_buffers()
    run_shutdown_hooks(launcher.config)
    return requeued


def run_shutdown_hooks(config: Config) -> None:
    """Call ``config.on_shutdown``, each once; one that raises is logged and the rest run."""
    for hook in config.on_shutdown:
        try:
            hook()
        except BaseException as exc:  # noqa: BLE001 - the process is leaving either way
            log.warning("shutdown_hook.failed", hook=repr(hook)[:200], error=describe(exc))


def dump_threads() -> None:
    """Log every thread's stack, as Sidekiq does on TTIN."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)"
        log.warning("thread.dump", thread=thread.name, stack=stack)



def worker_signals(launcher: Launcher, stop: Action,
                   stop_on: Iterable[int] = (signal.SIGTERM,)) -> dict[int, Action]:
    """A running worker's table: the ``stop_on`` signals run ``stop`` (whose
    result is the exit status), TSTP quiets, TTIN logs every thread's stack."""
    return {**dict.fromkeys(stop_on, stop), signal.SIGTSTP: launcher.quiet,
            signal.SIGTTIN: dump_threads}


def waiting_signals(quiet: list[bool],
                    stop_on: Iterable[int] = (signal.SIGTERM,)) -> dict[int, Action]:
    """The same signals while the worker waits for Redis, before any launcher runs:
    a stop ends the wait (status 0), TSTP is kept in ``quiet`` for the launcher,
    TTIN logs the stacks."""
    return {**dict.fromkeys(stop_on, _gave_up), signal.SIGTSTP: lambda: quiet.append(True),
            signal.SIGTTIN: dump_threads}


def _gave_up() -> int:
    return 0

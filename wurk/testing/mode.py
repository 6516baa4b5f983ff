"""The two testing modes, each a context manager and a decorator.

Duties:
1. While a mode is on, the enqueue verbs' default clients (``Client.default``,
   ``AsyncClient.default``) are its memory client
   (:mod:`wurk.testing.client`); leaving the mode puts back whatever was
   there, so modes nest.
2. :class:`Fake` collects pushes; ``drain`` runs them, and what they push,
   through the real lifecycle (:mod:`wurk.runtime` via
   :mod:`wurk.testing.runner`), retries included; ``run_due`` pushes the
   periodic entries due at a given time.
3. :class:`Inline` runs each push at once, on the pushing thread, and
   raises the job's own exception to the pusher.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ContextDecorator
from datetime import datetime
from typing import Any, cast

from wurk.core.job_errors import JobExpiredError
from wurk.push.aclient import AsyncClient
from wurk.push.client import Client
from wurk.push.periodic import PeriodicEntry
from wurk.push.periodic import table as periodic_table
from wurk.results import client as results
from wurk.results.records import Outcome
from wurk.settings.config import Config, default_config, when_configured
from wurk.testing.box import Box, FakeJob, job_name
from wurk.testing.client import MemoryAsyncClient, MemoryClient
from wurk.testing.runner import Ran, Runner

# A drain that runs this many jobs is taken for a job that pushes itself forever.
MAX_RUNS = 10_000
# A cron tick counts as due at ``at`` when it falls in the minute up to it.
DUE_WINDOW = 60.0
Outcomes = Callable[[str], "Outcome | None"]
_active: list[Mode] = []
_active_lock = threading.Lock()


class NoModeError(RuntimeError):
    """``wurk.testing.current()`` outside any testing mode."""


class Mode(ContextDecorator):
    """What both modes share: the memory clients, installed while the mode is on."""

    def __init__(self, config: Config | None = None) -> None:
        # None: the default config, followed while the mode is on.
        self._config = config
        self.box = Box()
        self._saved: list[tuple[Client | None, AsyncClient | None, Outcomes | None]] = []

    def __enter__(self) -> Any:
        config = self._config or default_config()
        self.box.clear()
        self.client = MemoryClient(config, self.box)
        self.runner = Runner(config, self.box)
        self._ticks: set[tuple[str, int]] = set()
        self._install()
        return self

    def _follow(self, config: Config) -> None:
        """A new default config was installed (an app factory in the test): a
        mode made without a config of its own pushes and runs on it from now on."""
        if self._config is None and config is not self.client.config:
            self.client.follow(config)
            self.runner = Runner(config, self.box)

    def __exit__(self, *exc: object) -> None:
        Client.stand_in, AsyncClient.stand_in, results.stand_in = self._saved.pop()
        with _active_lock:
            _active.remove(self)

    def _install(self) -> None:
        self._saved.append((Client.stand_in, AsyncClient.stand_in, results.stand_in))
        Client.stand_in = self.client
        AsyncClient.stand_in = cast("AsyncClient", MemoryAsyncClient(self.client))
        results.stand_in = self._outcome
        with _active_lock:
            _active.append(self)

    # -- what a test reads ----------------------------------------------------
    @property
    def results(self) -> dict[str, Any]:
        """Each stored result by jid (jobs pushed with ``store_result=True``)."""
        with self.box.lock:
            return dict(self.box.results)

    def result(self, jid: str) -> Any:
        """``wurk.result(jid)``, which reads this mode's results while it is on: the
        job's value, or :class:`wurk.JobFailed`; :class:`wurk.ResultTimeout` at
        once when the job has no final result yet (nothing runs while a test waits)."""
        if results.stand_in is None:
            raise NoModeError("this testing mode is not on")
        return results.result(jid)

    def _outcome(self, jid: str) -> Outcome | None:
        with self.box.lock:
            found = self.box.results.get(jid)
        return found if isinstance(found, Outcome) else None

    @property
    def locks(self) -> dict[str, str]:
        """The unique locks held now: key -> the holder's jid."""
        return self.box.held()

    def clear(self) -> None:
        """Forget every job, retry, dead entry, lock, result and periodic tick."""
        self.box.clear()
        self._ticks.clear()

    # -- periodic entries -------------------------------------------------------
    def run_due(self, at: float | datetime,
                entries: list[PeriodicEntry] | None = None) -> list[str]:
        """Push each periodic entry (``wurk.periodic``, or ``entries``) with a tick
        in the minute up to ``at``, once per tick, as the periodic loop would;
        the jids pushed."""
        when = at.timestamp() if isinstance(at, datetime) else float(at)
        jids: list[str] = []
        for entry in periodic_table.entries() if entries is None else entries:
            tick = entry.schedule.latest_at_or_before(when)
            if entry.paused or tick is None or when - tick >= DUE_WINDOW:
                continue
            if (entry.name, tick) in self._ticks:
                continue
            self._ticks.add((entry.name, tick))
            jid = self.client.push(entry.tick_payload(tick))
            if jid is not None:
                jids.append(jid)
        return jids


class Fake(Mode):
    """Pushes are collected in memory; nothing reaches Redis; ``drain`` runs them."""

    def __enter__(self) -> Fake:
        super().__enter__()
        return self

    @property
    def jobs(self) -> list[FakeJob]:
        """Every job pushed and not yet run, in push order (scheduled ones included)."""
        with self.box.lock:
            return list(self.box.pending)

    def jobs_in(self, queue: str) -> list[FakeJob]:
        """The jobs waiting in ``queue``, in push order."""
        return [job for job in self.jobs if job.queue == queue]

    def jobs_of(self, job: Any) -> list[FakeJob]:
        """The jobs of one job (its function, its class, ``.set(...)``, or its name)."""
        name = job_name(job)
        return [one for one in self.jobs if one.job_class == name]

    @property
    def retries(self) -> list[FakeJob]:
        """Retry entries a drain left (``drain`` runs them before it returns)."""
        with self.box.lock:
            return list(self.box.retries)

    @property
    def dead(self) -> list[FakeJob]:
        """Jobs whose retries ran out: their entry, with ``error`` the last exception."""
        with self.box.lock:
            return list(self.box.dead)

    def drain(self, queue: str | None = None, *, raise_failures: bool = True) -> int:
        """Run every collected job (of ``queue``, if named), what they push, and
        their retries, until none is left; how many runs that took.

        Then, with ``raise_failures``, the first job that failed for good (went
        to dead, or was dropped by ``retry=False``) has its exception raised."""
        first: BaseException | None = None
        runs = 0
        while (job := self.box.take(queue)) is not None:
            if runs == MAX_RUNS:
                raise RuntimeError(f"wurk.testing: drain ran {MAX_RUNS} jobs and more are "
                                   "waiting (a job that pushes itself forever?)")
            ran = self.runner.run(job)
            runs += 1
            if first is None and failed_for_good(ran):
                first = ran.failure
        if first is not None and raise_failures:
            raise first
        return runs


class Inline(Mode):
    """Each push runs its job at once, on the pushing thread; a failure raises there."""

    def __enter__(self) -> Inline:
        super().__enter__()
        self.box.on_push = self._run
        return self

    def _run(self, job: FakeJob) -> None:
        ran = self.runner.run(job)
        if ran.outcome == "retry":
            # No retry in this mode: the failure is the pusher's, and the job is gone.
            with self.box.lock:
                self.box.retries[:] = [one for one in self.box.retries if one.jid != job.jid]
            self.box.release(job.payload)
        if ran.failure is not None and not isinstance(ran.failure, JobExpiredError):
            raise ran.failure


def failed_for_good(ran: Ran) -> bool:
    return (ran.outcome in ("dead", "dropped") and ran.failure is not None
            and not isinstance(ran.failure, JobExpiredError))


def _followed(config: Config) -> None:
    with _active_lock:
        modes = list(_active)
    for mode in modes:
        mode._follow(config)


when_configured(_followed)


def fake(config: Config | None = None) -> Fake:
    """Collect pushes in memory: ``with wurk.testing.fake() as fake:``, or
    ``@wurk.testing.fake()`` on a function."""
    return Fake(config)


def inline(config: Config | None = None) -> Inline:
    """Run each push at once: ``with wurk.testing.inline():`` or ``@wurk.testing.inline()``."""
    return Inline(config)


def current() -> Mode:
    """The innermost testing mode on (for a decorated test that wants its fake)."""
    with _active_lock:
        if not _active:
            raise NoModeError("no wurk.testing mode is on")
        return _active[-1]

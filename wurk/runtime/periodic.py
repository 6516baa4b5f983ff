"""The periodic loop: enqueues each due tick of the periodic entries, once cluster-wide.

Every ``wurk run`` process with periodic entries, and every swarm parent,
runs one of these; they compete for one leader lease
(:mod:`wurk.runtime.leader`, name ``periodic``) and only the leader's loop
pushes. Even a leader that has lost its lease without knowing it (paused,
partitioned) pushes nothing: each push goes through the client chain whose
last step is the tick guard (:mod:`wurk.runtime.periodic_guard`), which
checks the lease value, the entry's mark and the tick's guard key in one
Lua step.

Duties:
1. ``start``: register the entries in Redis, start competing for the lease,
   start the loop thread (a :class:`wurk.core.service.Service`).
2. Each pass (every ``interval`` seconds, while leader): read every entry's
   mark and pause flag in one round trip, and for each unpaused entry with
   ticks in ``(mark, now]`` push at most one: the oldest, when it is at
   most ``grace`` seconds late (a hand-over or a slow pass loses no tick);
   else the ticks were missed (downtime) and only the latest counts: pushed
   once with ``missed="once"``, passed over (the mark moves past it) with
   ``missed="skip"`` unless it is itself on time.
3. Redis trouble or any other error never ends the thread: the pass is
   logged and the next one comes after a pause that doubles up to
   :data:`MAX_BACKOFF`; an error of one entry's own is logged and leaves
   the others alone. An entry whose hash vanished (Redis flushed or
   restarted empty) is registered again. A tick that a client middleware
   stops (before the guard) is passed over, not retried.
4. ``stop``: end the thread, give up the lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import redis.exceptions as rx

from wurk.core.backoff import Backoff
from wurk.core.logging import get_logger
from wurk.core.service import Service
from wurk.core.threads import describe
from wurk.push.client import Client
from wurk.push.periodic import PeriodicEntry
from wurk.redis.runtime import Runtime, handed
from wurk.runtime.periodic_guard import Lease, TickGuard, read_marks, register

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool
    from wurk.settings.config import Config

log = get_logger("wurk.periodic")
INTERVAL = 1.0
# A tick pushed up to this late is on time (a leader hand-over, a slow pass);
# later than that it was missed and the entry's ``missed`` option decides.
GRACE = 60.0
MAX_BACKOFF = 30.0
JOIN_TIMEOUT = 5.0
LEASE_NAME = "periodic"


def default_lease(config: Config) -> Lease:
    from wurk.runtime.leader import Leader  # noqa: PLC0415 - only processes with entries compete

    return Leader(LEASE_NAME, config=config)


class PeriodicLoop:
    def __init__(self, config: Config, entries: Sequence[PeriodicEntry], *,
                 lease: Lease | None = None, clock: Callable[[], float] = time.time,
                 interval: float = INTERVAL, grace: float = GRACE,
                 runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.entries = list(entries)
        self.lease = lease or default_lease(config)
        self.clock = clock
        self.interval = interval
        self.grace = grace
        self.guard = TickGuard(self.lease, {e.name: e for e in self.entries}, clock)
        # The config's own client middleware runs first; the guard is last.
        self.client = Client(config, drain_spool=False,
                             middleware=[*config.client_middleware, self.guard],
                             runtime=self.runtime)
        self.pushed = 0
        self._registered = False
        # After failed pass n: interval * 2**n, at most 256 intervals or MAX_BACKOFF.
        self._backoff = Backoff(first=2 * interval, cap=min(MAX_BACKOFF, interval * 2 ** 8))
        self.service = Service("periodic", self._pass, failed=self._failed)

    @property
    def pool(self) -> RedisPool:
        return self.runtime.pool

    def start(self) -> PeriodicLoop:
        if self.service.thread is None and not self.service.stopping:
            self.lease.start()
            self.service.start()
            log.info("periodic.started", entries=[e.name for e in self.entries])
        return self

    def stop(self) -> None:
        self.service.stop(self.runtime.pool.deadline.clip(JOIN_TIMEOUT))
        self.lease.stop()

    def _pass(self) -> float:
        self.run_pass()
        return self.interval

    def _failed(self, exc: BaseException, failures: int) -> float:
        """Redis down, a bug: log, back off (doubling, capped), go on."""
        pause = self._backoff.delay(failures)
        log.error("periodic.pass_failed", error=describe(exc), retry_in=round(pause, 3))
        return pause

    def run_pass(self) -> int:
        """Handle every entry's due tick once; returns how many were pushed."""
        if not self._registered:
            register(self.pool, self.entries, self.clock())
            self._registered = True
        if not self.entries or not self.lease.is_leader():
            return 0
        marks = read_marks(self.pool, self.entries)
        now = self.clock()
        pushed = 0
        for entry, (mark, paused) in zip(self.entries, marks, strict=True):
            if mark is None:
                # The hash is gone (a flushed or restarted Redis): declare it again.
                self._registered = False
            elif not paused:
                pushed += self._handle_safely(entry, mark, now)
        return pushed

    def _handle_safely(self, entry: PeriodicEntry, mark: int, now: float) -> int:
        """One entry's tick; an error of that entry's own (a client middleware
        that raises on its payload) is logged and leaves the others alone."""
        try:
            return self._handle(entry, mark, now)
        except (rx.RedisError, OSError):
            raise  # Redis trouble: the whole pass backs off
        except Exception as exc:  # noqa: BLE001 - retried at the next pass
            log.error("periodic.entry_failed", entry=entry.name, error=describe(exc))
            return 0

    def _handle(self, entry: PeriodicEntry, mark: int, now: float) -> int:
        due = entry.schedule.due(mark, now)
        if due is None:
            return 0
        first, latest = due
        if now - first <= self.grace:
            # Late but on time (a hand-over, a slow pass): each such tick is
            # pushed, the oldest first, one per pass.
            return self._push(entry, first, now - first)
        # Missed (downtime): never a backlog; the latest due tick is pushed
        # once ("once"), or only if it is itself on time ("skip").
        if entry.missed == "skip" and now - latest > self.grace:
            outcome = self.guard.skip(self.pool, entry, latest)
            log.warning("periodic.missed_skipped", entry=entry.name, tick=latest,
                        first=first, outcome=outcome)
            return 0
        log.warning("periodic.missed", entry=entry.name, tick=latest, first=first,
                    late=round(now - latest, 3))
        return self._push(entry, latest, now - latest)

    def _push(self, entry: PeriodicEntry, tick: int, late: float) -> int:
        self.guard.outcome = ""
        try:
            jid = self.client.push(entry.tick_payload(tick))
        except Exception as exc:
            if self.guard.outcome == "fired":
                # Claimed, then the write failed: this tick is lost, never doubled.
                log.error("periodic.write_failed", entry=entry.name, tick=tick,
                          error=describe(exc))
                return 0
            raise
        if jid is None:
            self._not_pushed(entry, tick, self.guard.outcome)
            return 0
        self.pushed += 1
        log.info("periodic.enqueued", entry=entry.name, tick=tick, jid=jid, late=round(late, 3))
        return 1

    def _not_pushed(self, entry: PeriodicEntry, tick: int, outcome: str) -> None:
        if outcome == "":
            # A client middleware before the guard stopped this tick (a unique
            # job still locked, say): the tick is passed over, not retried.
            log.info("periodic.stopped_by_middleware", entry=entry.name, tick=tick,
                     outcome=self.guard.skip(self.pool, entry, tick))
        elif outcome == "not_leader":
            # It believed it led; the lease in Redis says otherwise.
            log.warning("periodic.fenced", entry=entry.name, tick=tick)
        else:
            if outcome == "unregistered":
                self._registered = False
            log.debug("periodic.not_pushed", entry=entry.name, tick=tick, outcome=outcome)

"""The scheduler poller: moves due jobs from ``retry`` and ``schedule`` to queues.

Duties:
1. Every cycle, for ``retry`` then ``schedule``, move the due members to
   their queues with a fresh ``enqueued_at`` (jid, created_at and every
   other key kept). By default (``reliable_scheduler``) a batch of up to
   100 due members is read and moved inside Redis by the PROMOTE script,
   which pushes a member only if that same call removed it from the set.
   With ``reliable_scheduler = false``, Sidekiq's classic way: pop one due
   member with the ZPOPBYSCORE script, then push it through the client.
   Either way the score says a job is due: an ``at`` its payload carries
   is dropped unread.
2. One bad member (not JSON, nested too deep to decode, a lone surrogate
   no UTF-8 writer can carry, refused by the client, or anything else its
   own handling raises) goes to ``dead`` byte for byte, with a log line and
   its reason noted beside it (``wurk.wire.dead_notes``), and every other
   due member still moves in the same cycle; what PROMOTE is sent is bytes
   already, so no member can make the whole batch fail to encode. A pop
   whose reply was lost ends that set's sweep for this cycle rather than
   popping blind.
3. Sleep a random interval scaled by the number of live processes, so the
   whole cluster polls about once per ``average_scheduled_poll_interval``;
   when that count cannot be read, the interval of a lone process.
4. Nothing raised in a cycle (Redis down, a bug, a SystemExit out of a
   library) ends the thread: it is logged and the next cycle comes after the
   usual pause. The thread is a :class:`wurk.core.service.Service`.
5. ``stop`` is terminal and joins the thread, so no sweep runs on behalf of a
   process that has already said goodbye.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.core.threads import describe
from wurk.push.client import Client
from wurk.push.confirmed import PushNotConfirmedError
from wurk.redis.runtime import Runtime, handed
from wurk.runtime.retry import kill
from wurk.runtime.settle import note
from wurk.wire import keys
from wurk.wire.lua import PROMOTE, ZPOPBYSCORE
from wurk.wire.payload import dumps, loads_job, score

if TYPE_CHECKING:
    from wurk.runtime.work import Reason
    from wurk.settings.config import Config

log = get_logger("wurk.scheduled")
INITIAL_WAIT = 10.0
JOIN_TIMEOUT = 5.0
PROMOTE_BATCH = 100


def random_poll_interval(average: float, process_count: int, rng: random.Random) -> float:
    """Sidekiq's spread: uniform in [avg/2, 1.5*avg] below ten processes, else [0, avg)."""
    if process_count < 10:
        return average * rng.random() + average / 2
    return average * rng.random()


def due_job(raw: bytes) -> dict[str, Any]:
    """A due member's job, without any ``at`` it carries: its score said it is
    due, and a stale or hostile ``at`` ("x", 1e308, true) must neither send it
    back to the schedule nor to the morgue."""
    job = loads_job(raw)
    job.pop("at", None)
    return job


class Poller:
    def __init__(self, config: Config, rng: random.Random | None = None,
                 *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        # The launcher's own spool drainer pushes the spool.
        self.client = Client(config, drain_spool=False, runtime=self.runtime)
        self.rng = rng or random.Random()
        self.service = Service("scheduler", self._sweep, first_pause=self._initial_wait,
                               failed=logged(log, "scheduler.error", self._pause))

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop(self.runtime.pool.deadline.clip(JOIN_TIMEOUT))

    def _sweep(self) -> float:
        """One sweep (Redis trouble raises to the service, which logs it); the pause."""
        self.enqueue_due()
        return self._pause()

    def _pause(self) -> float:
        """The pause before the next sweep. Raises nothing."""
        try:
            return self._interval()
        except BaseException as exc:  # noqa: BLE001 - the process count is only a refinement
            log.error("scheduler.interval_failed", error=describe(exc))
            return random_poll_interval(self.config.average_scheduled_poll_interval, 1, self.rng)

    def _initial_wait(self) -> float:
        if self.config.poll_interval_average is not None:
            return 0.0
        return INITIAL_WAIT + self.rng.random() * 5

    def _interval(self) -> float:
        if self.config.poll_interval_average is not None:
            return random_poll_interval(self.config.poll_interval_average, 1, self.rng)
        count = self.runtime.pool.call("SCARD", keys.PROCESSES, idempotent=True)
        average = self.config.average_scheduled_poll_interval * max(1, int(count))
        return random_poll_interval(average, int(count), self.rng)

    def enqueue_due(self, now: float | None = None) -> int:
        """Move every due job; returns how many were pushed."""
        moved = 0
        when = time.time() if now is None else now
        at = score(when)
        for sset in (keys.RETRY, keys.SCHEDULE):
            if self.config.reliable_scheduler:
                moved += self._promote_due(sset, when)
                continue
            while not self.service.stopping:
                raw = self._pop_due(sset, at)
                if raw is None:
                    break
                moved += self._push_promoted(raw, sset)
        return moved

    def _promote_due(self, sset: str, now: float) -> int:
        """The reliable path: read a batch of due members, then move them in one script."""
        moved = 0
        while not self.service.stopping:
            members: list[bytes] = self.runtime.pool.call(
                "ZRANGEBYSCORE", sset, "-inf", score(now), "LIMIT", 0, PROMOTE_BATCH,
                idempotent=True)
            if not members:
                break
            died = time.time()
            args: list[Any] = [score(died), score(died - self.config.dead_timeout),
                               self.config.dead_max_jobs]
            for raw in members:
                form = self._promoted_form(raw, sset)
                if isinstance(form[0], str):  # a reason: to the morgue, noted first
                    note(self.runtime, raw, (form[0], str(form[1])), died)
                    form = (b"", b"")
                args += [raw, *form]
            moved += self._promote(sset, args)
            if len(members) < PROMOTE_BATCH:
                break
        return moved

    def _promote(self, sset: str, args: list[Any]) -> int:
        return int(self.runtime.pool.run(
            lambda c: PROMOTE.run(c, [sset, keys.QUEUES, keys.DEAD], args), idempotent=True))

    def _promoted_form(self, raw: bytes, sset: str) -> tuple[bytes, bytes] | Reason:
        """(queue, payload with a fresh enqueued_at) as the bytes PROMOTE is
        sent, or why the member goes to the morgue instead."""
        try:
            payload, _ = self.client.normalise(due_job(raw), time.time())
            return str(payload["queue"]).encode(), dumps(payload).encode()
        except BaseException as exc:  # noqa: BLE001 - one member's trouble is that member's
            log.error("scheduler.malformed", set=sset, error=describe(exc),
                      payload=raw[:200].decode("utf-8", "replace"))
            return type(exc).__name__, _reason_text(exc, sset)

    def _pop_due(self, sset: str, at: str) -> bytes | None:
        try:
            popped: bytes | None = self.runtime.pool.run(
                lambda c: ZPOPBYSCORE.run(c, [sset], [at]))
        except Exception as exc:  # noqa: BLE001
            log.error("scheduler.pop_failed", set=sset, error=f"{type(exc).__name__}: {exc}")
            return None
        return popped

    def _push_promoted(self, raw: bytes, sset: str) -> int:
        try:
            self.client.push(due_job(raw))
        except (rx.RedisError, OSError, PushNotConfirmedError) as exc:
            # Popped but maybe not pushed: the classic poller's known window.
            # The reliable scheduler moves due jobs inside Redis and has none.
            log.error("scheduler.push_failed", set=sset, error=describe(exc),
                      payload=raw.decode("utf-8", "replace"))
            return 0
        except BaseException as exc:  # noqa: BLE001 - anything else is wrong with the member
            # Refused before anything was sent (not a job, a bad queue, too
            # deep to decode): to the morgue rather than lost or retried.
            self._bury(raw, sset, exc)
            return 0
        return 1

    def _bury(self, raw: bytes, sset: str, exc: BaseException) -> None:
        log.error("scheduler.malformed", set=sset, error=describe(exc),
                  payload=raw[:200].decode("utf-8", "replace"))
        try:
            kill(self.runtime, raw, reason=(type(exc).__name__, _reason_text(exc, sset)))
        except BaseException as failure:  # noqa: BLE001 - the log line is all that is left
            log.error("scheduler.kill_failed", set=sset, error=describe(failure),
                      payload=raw.decode("utf-8", "replace"))


def _reason_text(exc: BaseException, sset: str) -> str:
    return f"the scheduler could not move it out of {sset!r}: {describe(exc)}"

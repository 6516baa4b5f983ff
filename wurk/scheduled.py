"""The scheduler poller: moves due jobs from ``retry`` and ``schedule`` to queues.

Duties:
1. Every cycle, for ``retry`` then ``schedule``, pop due members one at a
   time with the ZPOPBYSCORE script and push each through the client (a new
   ``enqueued_at``, jid and created_at kept, every other key untouched).
2. One bad member (not JSON, a push that raises) is reported and the sweep
   goes on; a pop whose reply was lost ends that set's sweep for this cycle
   rather than popping blind.
3. Sleep a random interval scaled by the number of live processes, so the
   whole cluster polls about once per ``average_scheduled_poll_interval``.
4. ``stop`` is terminal and joins the thread, so no sweep runs on behalf of a
   process that has already said goodbye.
"""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING, Any

from wurk import keys
from wurk.client import Client
from wurk.logging import get_logger
from wurk.lua import PROMOTE, ZPOPBYSCORE
from wurk.payload import PayloadError, dumps, loads_job, score
from wurk.retry import kill

if TYPE_CHECKING:
    from wurk.config import Config

log = get_logger("wurk.scheduled")
INITIAL_WAIT = 10.0
JOIN_TIMEOUT = 5.0
PROMOTE_BATCH = 100


def random_poll_interval(average: float, process_count: int, rng: random.Random) -> float:
    """Sidekiq's spread: uniform in [avg/2, 1.5*avg] below ten processes, else [0, avg)."""
    if process_count < 10:
        return average * rng.random() + average / 2
    return average * rng.random()


class Poller:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self.config = config
        # The launcher's own spool drainer pushes the spool.
        self.client = Client(config, drain_spool=False)
        self.rng = rng or random.Random()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="wurk-scheduler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT)
            if not self._thread.is_alive():
                self._thread = None

    def _loop(self) -> None:
        if not self._done.wait(self._initial_wait()):
            while not self._done.is_set():
                try:
                    self.enqueue_due()
                except Exception as exc:  # noqa: BLE001 - keep polling through Redis trouble
                    log.error("scheduler.error", error=f"{type(exc).__name__}: {exc}")
                if self._done.wait(self._interval()):
                    break

    def _initial_wait(self) -> float:
        if self.config.poll_interval_average is not None:
            return 0.0
        return INITIAL_WAIT + self.rng.random() * 5

    def _interval(self) -> float:
        if self.config.poll_interval_average is not None:
            return random_poll_interval(self.config.poll_interval_average, 1, self.rng)
        count = self.config.pool.call("SCARD", keys.PROCESSES, idempotent=True)
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
            while not self._done.is_set():
                raw = self._pop_due(sset, at)
                if raw is None:
                    break
                moved += self._push_promoted(raw, sset)
        return moved

    def _promote_due(self, sset: str, now: float) -> int:
        """The reliable path: read a batch of due members, then move them in one script."""
        moved = 0
        while not self._done.is_set():
            members: list[bytes] = self.config.pool.call(
                "ZRANGEBYSCORE", sset, "-inf", score(now), "LIMIT", 0, PROMOTE_BATCH,
                idempotent=True)
            if not members:
                break
            args: list[Any] = [score(time.time()), score(time.time() - self.config.dead_timeout),
                               self.config.dead_max_jobs]
            for raw in members:
                args += [raw, *self._promoted_form(raw, sset)]
            moved += self._promote(sset, args)
            if len(members) < PROMOTE_BATCH:
                break
        return moved

    def _promote(self, sset: str, args: list[Any]) -> int:
        return int(self.config.pool.run(
            lambda c: PROMOTE.run(c, [sset, keys.QUEUES, keys.DEAD], args), idempotent=True))

    def _promoted_form(self, raw: bytes, sset: str) -> tuple[str, str]:
        """(queue, payload with a fresh enqueued_at), or ("", "") for the morgue."""
        try:
            payload, _ = self.client.normalise(loads_job(raw), time.time())
        except (PayloadError, TypeError, ValueError) as exc:
            log.error("scheduler.malformed", set=sset, error=str(exc),
                      payload=raw[:200].decode("utf-8", "replace"))
            return "", ""
        return str(payload["queue"]), dumps(payload)

    def _pop_due(self, sset: str, at: str) -> bytes | None:
        try:
            popped: bytes | None = self.config.pool.run(
                lambda c: ZPOPBYSCORE.run(c, [sset], [at]))
        except Exception as exc:  # noqa: BLE001
            log.error("scheduler.pop_failed", set=sset, error=f"{type(exc).__name__}: {exc}")
            return None
        return popped

    def _push_promoted(self, raw: bytes, sset: str) -> int:
        try:
            job = loads_job(raw)
        except PayloadError as exc:
            log.error("scheduler.malformed", set=sset, error=str(exc))
            kill(self.config, raw)
            return 0
        try:
            self.client.push(job)
        except (TypeError, ValueError) as exc:
            # Refused before anything was sent (a non-string queue, a bad
            # ``at``): malformed, so to the morgue rather than lost.
            log.error("scheduler.malformed", set=sset, jid=job.get("jid"), error=str(exc))
            kill(self.config, raw)
            return 0
        except Exception as exc:  # noqa: BLE001
            # Popped but not pushed: the classic poller's known window. The
            # reliable scheduler moves due jobs inside Redis and has none.
            log.error("scheduler.push_failed", set=sset, jid=job.get("jid"),
                      error=f"{type(exc).__name__}: {exc}", payload=raw.decode("utf-8", "replace"))
            return 0
        return 1

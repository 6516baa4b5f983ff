"""The reaper: gives the private lists of dead processes back to their queues.

Duties:
1. ``recover(config, identity)``: in one script, push every job in a dead
   process's private lists back to its queue (oldest nearest the fetch end)
   and mark it a suspect, which reliable fetch runs alone until one of its
   runs finishes. Only a job that was the one job its dead process held is
   blamed for the death: a poison-pill counter per jid; a job blamed more
   than ``max_recoveries`` times goes to the dead set instead. Jobs that
   died in company are not counted, so they never share a crasher's count.
2. A periodic sweep (at boot, then every ``reaper_interval`` seconds, under a
   cluster-wide lock so processes do not dogpile): every registered owner
   whose heartbeat hash has expired is recovered. A sweep that raises
   anything is logged and tried again an interval later; the thread runs
   under :mod:`wurk.core.threads`.

A live process, even one draining for minutes, keeps beating, so the sweep
never takes its jobs. The swarm parent calls ``recover`` directly the moment
it reaps a child, instead of waiting a minute for the heartbeat to lapse.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.redis.pools import pool_for
from wurk.wire import keys
from wurk.wire.lua import RECOVER
from wurk.wire.payload import score

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.reaper")


def recover(config: Config, identity: str, now: float | None = None, *,
            attempts: int | None = None, died: bool = True) -> tuple[int, int]:
    """Recover one identity's private lists; returns (requeued, killed as poison pills).

    ``attempts`` caps the pool's tries (the swarm parent makes one per tick).
    ``died=False``: a live process giving back what its stop left behind; no
    job is blamed or made a suspect.
    """
    at = time.time() if now is None else now
    reply = pool_for(config).run(lambda c: RECOVER.run(
        c, [keys.WIP_OWNERS, keys.wip_queues(identity), keys.DEAD, keys.QUEUES, keys.SUSPECTS],
        [identity, keys.wip_prefix(identity), config.max_recoveries, keys.PILL_PREFIX,
         keys.PILL_TTL, score(at), score(at - config.dead_timeout), config.dead_max_jobs,
         "1" if died else "0"]),
        attempts=attempts)
    requeued, killed = int(reply[0]), int(reply[1])
    if requeued or killed:
        log.warning("reaper.recovered", identity=identity, requeued=requeued, killed=killed)
    return requeued, killed


def sweep(config: Config, me: str | None = None) -> int:
    """Recover every owner whose heartbeat expired; returns how many were recovered."""
    lock_ttl = max(1, int(config.reaper_interval / 2))
    if not pool_for(config).call("SET", keys.REAPER_LOCK, me or "-", "NX", "EX", lock_ttl):
        return 0
    owners = [m.decode() for m in
              pool_for(config).call("SMEMBERS", keys.WIP_OWNERS, idempotent=True)]
    others = [o for o in owners if o != me]
    alive = pool_for(config).pipeline([("EXISTS", o) for o in others], idempotent=True)
    dead = [o for o, exists in zip(others, alive, strict=True) if not exists]
    for identity in dead:
        recover(config, identity)
    return len(dead)


class Reaper:
    def __init__(self, config: Config, identity: str) -> None:
        self.config = config
        self.identity = identity
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threads.start("reaper", self._loop, stopped=self._done.is_set)

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(pool_for(self.config).deadline.clip(5.0))

    def _loop(self) -> None:
        while True:
            try:
                sweep(self.config, self.identity)
            except BaseException as exc:  # noqa: BLE001 - try again next interval
                log.error("reaper.error", error=f"{type(exc).__name__}: {exc}")
            if self._done.wait(self.config.reaper_interval):
                return

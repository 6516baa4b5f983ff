"""Settling a failed job: where it goes next, written in one atomic step.

A failed job leaves its private list and lands in ``retry`` or ``dead`` in
the same Lua call (``wurk.wire.lua.SETTLE``), so there is never a separate
acknowledgement that could outlive the failure it belongs to and delete a
later copy of the job.

Duties:
1. A :class:`~wurk.runtime.work.Settlement` says where a failed job goes: a retry entry, a dead
   entry, a schedule entry (a job a limiter refused, ``wurk.runtime.overlimit``), or
   nowhere (dropped by ``retry: false``, ``dead: false`` or a discard).
2. :func:`write` runs the script once: it removes the copy this run claimed
   (if the fetch keeps private lists) and, only if that copy was still
   there, writes the entry. Replaying it cannot write twice.
3. :func:`until_settled` retries the write through Redis trouble (an
   outage, a dropped connection, a maxmemory refusal) with backoff, never
   in a tight loop, until it lands or a stop abandons the job; an abandoned
   job's copy stays in its private list for the stop's release or the
   reaper.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import backoff_delay
from wurk.redis.pools import pool_for
from wurk.wire import keys
from wurk.wire.lua import SETTLE
from wurk.wire.payload import score

if TYPE_CHECKING:
    from wurk.runtime.work import Fetch, Settlement, UnitOfWork
    from wurk.settings.config import Config

log = get_logger("wurk.settle")
_TARGETS = {"schedule": keys.SCHEDULE, "dead": keys.DEAD}


def write(config: Config, settlement: Settlement, private_list: str = "", claimed: bytes = b"",
          pill: str = "") -> bool:
    """Run SETTLE once; False if the ``claimed`` copy was no longer in ``private_list``."""
    # A job rescheduled by a limiter ("schedule") is written as a retry is, to another set.
    mode = {"retry": "retry", "schedule": "retry", "dead": "dead"}.get(settlement.outcome, "drop")
    if mode == "drop" and not private_list:
        return True  # nothing to remove and nothing to write
    target = _TARGETS.get(settlement.outcome, keys.RETRY)
    args: list[Any] = [private_list, claimed, pill, mode, score(settlement.at),
                       settlement.entry, score(settlement.at - config.dead_timeout),
                       config.dead_max_jobs]
    # Idempotent: the claimed copy is removed before anything is written, so a
    # replay of a settle that landed finds no copy and writes nothing; without
    # a private list a replay re-adds the same member at the same score.
    settled = pool_for(config).run(lambda c: SETTLE.run(c, [target, keys.SUSPECTS], args),
                              idempotent=True)
    return bool(settled)


def until_settled(config: Config, fetch: Fetch, work: UnitOfWork, settlement: Settlement, *,
                  jid: str | None, abandoned: Callable[[float], bool],
                  rng: random.Random | None = None) -> bool:
    """Settle, retrying with backoff; False if ``abandoned(wait)`` said a stop took the job.

    ``abandoned(seconds)`` waits up to that long and tells whether the job
    was abandoned meanwhile.
    """
    rng = rng or random.Random()
    attempt = 0
    while True:
        try:
            return _settled(fetch.settle(work, jid, settlement), work, jid, settlement)
        except Exception as exc:  # noqa: BLE001 - Redis trouble: the job waits, it is not lost
            attempt += 1
            log.error("job.settle_failed", jid=jid, queue=work.queue, outcome=settlement.outcome,
                      attempt=attempt, error=describe(exc))
        delay = backoff_delay(attempt, config.redis_retry_base, config.redis_retry_cap, rng)
        if abandoned(delay):
            log.warning("job.settle_abandoned", jid=jid, queue=work.queue)
            return False


def _settled(done: bool, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
    if not done:
        # The copy was gone: a stop gave it back first (the job runs again, as
        # at-least-once allows), or a replayed attempt had already landed.
        log.warning("job.settle_skipped", jid=jid, queue=work.queue, outcome=settlement.outcome)
    return done

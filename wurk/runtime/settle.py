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
   there, writes the entry. Replaying it cannot write twice. A copy that
   went with Redis's data (the ``epoch`` it was claimed under is gone,
   ``wurk.runtime.epoch``) still gets its entry, once.
3. :func:`until_settled` retries the write through Redis trouble (an
   outage, a dropped connection, a maxmemory refusal) with backoff, never
   in a tight loop, until it lands or a stop abandons the job; an abandoned
   job's copy stays in its private list for the stop's release or the
   reaper.
4. Anything else raised while settling (an entry no UTF-8 writer can
   carry, a bug) is a defect that no retry cures: it is logged once
   (``job.settle_defect``) and the job is parked instead, its payload as
   fetched sent to ``dead`` with the reason (``job.unparkable`` if even
   that fails; the copy then stays in its private list).
5. An entry kept as raw bytes gets its reason written beside it first
   (``wurk.wire.dead_notes``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import SHORTEST_WAIT, redis_trouble, trouble_backoff
from wurk.runtime.work import Settlement
from wurk.wire import dead_notes, keys
from wurk.wire.lua import SETTLE
from wurk.wire.payload import score

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime
    from wurk.runtime.work import Fetch, Reason, UnitOfWork
    from wurk.settings.config import Config

log = get_logger("wurk.settle")
_TARGETS = {"schedule": keys.SCHEDULE, "dead": keys.DEAD}


def write(runtime: Runtime, settlement: Settlement, private_list: str = "",
          claimed: bytes = b"", pill: str = "", *, epoch: str = "") -> bool:
    """Run SETTLE once on ``runtime``'s pool; False if the ``claimed`` copy was no
    longer in ``private_list`` (and Redis still holds the ``epoch`` it was claimed under)."""
    config = runtime.config
    # A job rescheduled by a limiter ("schedule") is written as a retry is, to another set.
    mode = {"retry": "retry", "schedule": "retry", "dead": "dead"}.get(settlement.outcome, "drop")
    if mode == "drop" and not private_list:
        return True  # nothing to remove and nothing to write
    if settlement.reason is not None:
        note(runtime, settlement.entry, settlement.reason, settlement.at)
    target = _TARGETS.get(settlement.outcome, keys.RETRY)
    args: list[Any] = [private_list, claimed, pill, mode, score(settlement.at),
                       settlement.entry, score(settlement.at - config.dead_timeout),
                       config.dead_max_jobs, epoch,
                       _marker(private_list, claimed, settlement, epoch), keys.SETTLED_TTL]
    # Idempotent: the claimed copy is removed before anything is written, so a
    # replay of a settle that landed finds no copy and writes nothing; one
    # written after a data loss left a marker the replay finds; without a
    # private list a replay re-adds the same member at the same score.
    settled = runtime.pool.run(
        lambda c: SETTLE.run(c, [target, keys.SUSPECTS, keys.EPOCH], args), idempotent=True)
    if settled == 2:
        log.warning("job.settled_after_data_loss", private_list=private_list,
                    outcome=settlement.outcome)
    return bool(settled)


def _marker(private_list: str, claimed: bytes, settlement: Settlement, epoch: str) -> str:
    """The same for every attempt at one settlement, and only for it (the entry
    carries the failure's time); "" when SETTLE cannot need it."""
    if not private_list or not epoch:
        return ""
    entry = settlement.entry if isinstance(settlement.entry, bytes) else \
        settlement.entry.encode("utf-8", "surrogatepass")
    digest = hashlib.sha1(b"\n".join((private_list.encode(), claimed, entry)))  # noqa: S324
    return keys.SETTLED_PREFIX + digest.hexdigest()


def note(runtime: Runtime, raw: str | bytes, reason: Reason, at: float) -> None:
    """Write why ``raw`` goes to dead as it is, before it goes (replay-safe)."""
    config = runtime.config
    args = dead_notes.note_args(raw, reason, at, dead_timeout=config.dead_timeout,
                                dead_max_jobs=config.dead_max_jobs)
    runtime.pool.run(lambda c: dead_notes.NOTE.run(c, dead_notes.KEYS, args), idempotent=True)


def until_settled(config: Config, fetch: Fetch, work: UnitOfWork, settlement: Settlement, *,
                  jid: str | None, abandoned: Callable[[float], bool],
                  rng: random.Random | None = None) -> Settlement | None:
    """Settle, retrying with backoff; what was written (``settlement``, or the
    dead entry that parked the job), or None if it was not: ``abandoned(wait)``
    said a stop took the job, or its copy was gone.

    ``abandoned(seconds)`` waits up to that long and tells whether the job
    was abandoned meanwhile.
    """
    rng = rng or random.Random()
    attempt = 0
    while True:
        try:
            done = _settled(fetch.settle(work, jid, settlement), work, jid, settlement)
            return settlement if done else None
        except Exception as exc:  # noqa: BLE001 - Redis trouble: the job waits, it is not lost
            if not redis_trouble(exc):
                parked = _park(work, jid, settlement, exc)
                if parked is None:
                    return None
                settlement, attempt = parked, 0
                continue
            attempt += 1
            log.error("job.settle_failed", jid=jid, queue=work.queue, outcome=settlement.outcome,
                      attempt=attempt, error=describe(exc))
        delay = max(SHORTEST_WAIT, trouble_backoff(config.redis_retry_base,
                                                   config.redis_retry_cap).delay(attempt, rng))
        if abandoned(delay):
            log.warning("job.settle_abandoned", jid=jid, queue=work.queue)
            return None


def _park(work: UnitOfWork, jid: str | None, settlement: Settlement,
          exc: Exception) -> Settlement | None:
    """The dead entry that parks a job whose settlement raised ``exc``; None
    when that settlement was already one (then the copy stays where it is)."""
    payload = work.raw[:200].decode("utf-8", "replace")
    if settlement.reason is not None and settlement.entry == work.raw:
        log.error("job.unparkable", jid=_loggable(jid), queue=work.queue,
                  error=describe(exc), payload=payload)
        return None
    log.error("job.settle_defect", jid=_loggable(jid), queue=work.queue,
              outcome=settlement.outcome, error=describe(exc), payload=payload)
    message = f"wurk could not write this job's {settlement.outcome} entry: {describe(exc)}"
    return Settlement.dead(work.raw, reason=(type(exc).__name__, message))


def _loggable(jid: str | None) -> str | None:
    return jid if jid is None or jid.isascii() else jid.encode("utf-8", "replace").decode()


def _settled(done: bool, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
    if not done:
        # The copy was gone: a stop gave it back first (the job runs again, as
        # at-least-once allows), or a replayed attempt had already landed.
        log.warning("job.settle_skipped", jid=jid, queue=work.queue, outcome=settlement.outcome)
    return done

"""Unique jobs, worker side: when a job gives back the lock its push took.

The job's lifecycle tells this module (its :class:`UniqueStep`) when a job
starts and how it ended; the payload says when its lock goes
(``unique_until``, :mod:`wurk.unique.keys`):

1. ``start``: released as the job starts, before its middleware runs, so a
   duplicate may be pushed while it runs.
2. ``success`` (the default, as Sidekiq Enterprise's): released once the
   job succeeded, with its settlement (one of its writes, sent with its
   other steps' before the acknowledgement, retried through Redis trouble
   until it lands: ``wurk.runtime.lifecycle.writes``). A failure that goes
   to retry keeps the lock (it still has ``unique_for`` to run out); a job that dies, is
   discarded or has no retries releases it, as Enterprise's death handler
   does (a delete, kill or clear by hand from the admin tools releases it
   too, in the script that removes the job: ``wurk.api.removal``).
3. ``expiry``: never released; the lock simply expires.

Every release is a compare-and-delete in Lua (UNIQUE_RELEASE): only a lock
still holding this job's jid goes, never a duplicate's that took the key
after ours expired. A job that is not unique never calls the step in; a
release at start that Redis refuses is never raised into the job: it is
kept and sent again until it lands (:mod:`wurk.wire.kept_writes`), for as
long as the lock could live (its ``unique_for``, plus :data:`MARGIN`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.core.validate import is_number
from wurk.redis.wait import waiting_helps
from wurk.runtime.lifecycle.step import Ending, Run, Step
from wurk.runtime.lifecycle.writes import Write
from wurk.unique import keys as unique
from wurk.unique.push import give_back
from wurk.wire import kept_writes
from wurk.wire.lua import UNIQUE_RELEASE

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime

log = get_logger("wurk.unique")
# A kept release is sent again for the lock's own unique_for, plus this, then
# left to the lock's TTL.
MARGIN = 60.0


class UniqueStep(Step):
    """The job's lock: noted (and released for ``start``) as it starts, released as it ends."""

    name = "unique"
    triggers = (unique.FOR, unique.LOCK)

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def start(self, run: Run) -> None:
        started(self.runtime, run.job)

    def concluding(self, run: Run, ending: Ending) -> list[Write]:
        return release_writes(self.runtime, run.job, ending.outcome)


def started(runtime: Runtime, job: dict[str, Any]) -> None:
    """A job is about to run: note its lock key, and release it for ``start``."""
    if unique.FOR not in job or not unique.is_unique(job):
        return
    key = unique.lock_of(job)
    if key is None:
        return
    # Kept in the payload, so a retry releases the key locked at push time
    # even after retry_queue changed the queue the digest was made from.
    job[unique.LOCK] = key
    if unique.until_of(job) == unique.START:
        release(runtime, job)


def release_writes(runtime: Runtime, job: dict[str, Any], outcome: str) -> list[Write]:
    """What a run that ended with ``outcome`` ("success", "retry", "dead" or
    "dropped" or "cancelled") gives back: its lock, written with the job's settlement."""
    if unique.LOCK not in job or outcome == "retry" or unique.until_of(job) != unique.SUCCESS:
        return []
    key, jid = unique.lock_of(job), job.get("jid")
    if key is None or not isinstance(jid, str):
        return []

    def refused(exc: Exception, attempt: int) -> bool:
        # An outage: sent again with the settlement (a compare-and-delete is
        # safe to repeat). Anything waiting will not cure (an ACL refusal):
        # the job goes on, and the release is kept and sent again for as long
        # as the lock could live.
        again = waiting_helps(exc)
        log.warning("unique.release_failed", jid=jid, lock=key, error=describe(exc),
                    attempt=attempt, retrying=True)
        if not again:
            retry_later(runtime, key, jid, job)
        return again

    return [Write(UNIQUE_RELEASE, [key], [jid], refused=refused)]


def release(runtime: Runtime, job: dict[str, Any]) -> bool:
    """Drop the job's lock if it still holds the job's jid; True when it did."""
    key = unique.lock_of(job)
    if key is None:
        return False
    jid = job.get("jid")
    try:
        return give_back([{unique.LOCK: key, "jid": jid}], runtime.pool) == 1
    except Exception as exc:  # noqa: BLE001 - kept and sent again once Redis answers
        log.warning("unique.release_failed", jid=jid, lock=key, error=describe(exc),
                    retrying=isinstance(jid, str))
        if isinstance(jid, str):
            retry_later(runtime, key, jid, job)
        return False


def retry_later(runtime: Runtime, key: str, jid: str, job: dict[str, Any]) -> None:
    """Keep a release Redis refused, to send again for as long as the lock could live."""
    kept_writes.keep(runtime.pool, UNIQUE_RELEASE, [key], [jid],
                     until=time.monotonic() + _lifetime(job) + MARGIN, what="unique_release")


def _lifetime(job: dict[str, Any]) -> float:
    """How long the lock can live: its ``unique_for`` (a scheduled wait aside)."""
    ttl = job.get(unique.FOR)
    if not is_number(ttl) or not ttl > 0:
        return 0.0
    return float(min(ttl, unique.MAX_SECONDS))

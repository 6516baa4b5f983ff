"""Unique jobs, worker side: when a job gives back the lock its push took.

The processor tells this module when a job starts and how it ended; the
payload says when its lock goes (``unique_until``, :mod:`wurk.wire.unique`):

1. ``start``: released as the job starts, before its middleware runs, so a
   duplicate may be pushed while it runs.
2. ``success`` (the default, as Sidekiq Enterprise's): released once the
   job succeeded and its acknowledgement was handed to the fetch. A failure that goes to retry keeps
   the lock (it still has ``unique_for`` to run out); a job that dies, is
   discarded or has no retries releases it, as Enterprise's death handler
   does (a kill by hand from the admin tools leaves it to expire, also as
   Enterprise does).
3. ``expiry``: never released; the lock simply expires.

Every release is a compare-and-delete in Lua (UNIQUE_RELEASE): only a lock
still holding this job's jid goes, never a duplicate's that took the key
after ours expired. A job that is not unique costs one dict lookup; a
release that Redis refuses is logged and left to the lock's TTL, never
raised into the processor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push.unique import give_back
from wurk.redis.pools import pool_for
from wurk.wire import unique

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.unique")


def started(config: Config, job: dict[str, Any]) -> None:
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
        release(config, job)


def finished(config: Config, job: dict[str, Any], outcome: str) -> None:
    """A run ended with ``outcome`` ("success", "retry", "dead" or "dropped")."""
    if unique.LOCK not in job or outcome == "retry":
        return
    if unique.until_of(job) == unique.SUCCESS:
        release(config, job)


def release(config: Config, job: dict[str, Any]) -> bool:
    """Drop the job's lock if it still holds the job's jid; True when it did."""
    key = unique.lock_of(job)
    if key is None:
        return False
    try:
        return give_back([{unique.LOCK: key, "jid": job.get("jid")}], pool_for(config)) == 1
    except Exception as exc:  # noqa: BLE001 - the lock's TTL ends it anyway
        log.warning("unique.release_failed", jid=job.get("jid"), lock=key, error=describe(exc))
        return False

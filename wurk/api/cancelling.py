"""Cancel one job by jid, wherever it is: waiting, or running on any host.

Celery's ``revoke(terminate=True)`` and arq's ``abort``, over Redis only
(no signal crosses a host).

Duties:
1. :func:`cancel`: leave a cancel marker for the jid first
   (``wurk:cancel:<jid>``, :data:`~wurk.wire.keys.CANCEL_TTL`), so a job
   fetched while this call looks elsewhere is still caught; then remove it
   from the schedule, the retry set or its queue through the removal script
   (:mod:`wurk.api.removal`: its lock released, its batch counting a job
   that will not run, its result waiters told ``JobCancelled``); else find
   it in a live process's work (the heartbeat's hash), or in its reliable
   fetch private lists, which hold a job from its fetch on, while the work
   hash shows it only from that process's next beat (up to
   ``heartbeat_interval`` later): the process running it reads the marker
   within a second (``wurk.runtime.cancelling``).
2. Say where it was (:class:`Cancelled`), or raise
   :class:`~wurk.api.errors.JobNotFoundError` for a jid found nowhere. The
   marker stays then: a job fetched in the instant between the looks (or,
   without reliable fetch, since its process's last beat) is still cancelled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wurk.api import removal
from wurk.api.errors import JobNotFoundError
from wurk.api.queue import Queue
from wurk.api.sorted_sets import RetrySet, ScheduledSet, SortedSet
from wurk.api.workers import Workers
from wurk.redis.runtime import Runtime, runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.replies import resolve, sscan_all, text

if TYPE_CHECKING:
    from wurk.redis.connection import Conn

__all__ = ["Cancelled", "cancel"]
# The most entries read of one private list: it holds a process's jobs in
# flight from that queue (at most its concurrency), so a longer one is not
# read whole on a person's behalf.
IN_FLIGHT_READ = 1000
# Where a cancelled job was: what the CLI and the JSON say.
QUEUED, SCHEDULED, RETRY, RUNNING = "queued", "scheduled", "retry", "running"


@dataclass(frozen=True)
class Cancelled:
    """A cancel that found its job: ``state`` (queued, scheduled, retry or
    running), ``where`` (the queue, the set, or the process identity)."""

    jid: str
    state: str
    where: str


def cancel(jid: str, *, kill: bool = False, config: Config | None = None) -> Cancelled:
    """Cancel the job ``jid``; with ``kill``, a running job's process recycles
    (for a job stuck in C code that no exception reaches)."""
    config = resolve(config)
    runtime = runtime_for(config)
    # Replay-safe: SET with a TTL writes the same marker again.
    runtime.pool.call("SET", keys.cancel(jid), "kill" if kill else "1",
                      "EX", keys.CANCEL_TTL, idempotent=True)
    found = _waiting(runtime, jid, config)
    if found is not None:
        # It never runs: the marker has nothing left to stop. Replay-safe.
        runtime.pool.call("DEL", keys.cancel(jid), idempotent=True)
        return found
    for identity, _thread, work in Workers(config=config):
        if work.payload.get("jid") == jid:
            return Cancelled(jid, RUNNING, identity)
    holder = runtime.pool.run(lambda conn: _fetched(conn, jid), idempotent=True)
    if holder is not None:
        return Cancelled(jid, RUNNING, holder)
    raise JobNotFoundError(jid, "the queues, the schedule, the retry set or the running jobs")


def _waiting(runtime: Runtime, jid: str, config: Config) -> Cancelled | None:
    """The job removed from the schedule, the retry set or a queue, if it waits there."""
    for state, jobs in ((SCHEDULED, ScheduledSet(config=config)),
                        (RETRY, RetrySet(config=config))):
        if _removed(jobs, jid):
            return Cancelled(jid, state, jobs.name)
    for queue in Queue.all(config=config):
        record = queue.find_job(jid)
        source = keys.queue(queue.name)
        # Not replay-safe: a replay could remove a byte-identical second copy.
        if record is not None and removal.remove(
                runtime, source, removal.LIST, [record.value],
                removal.Ending(source, cancelled=True), idempotent=False)[0]:
            return Cancelled(jid, QUEUED, queue.name)
    return None


def _fetched(conn: Conn, jid: str) -> str | None:
    """The live process whose private lists hold ``jid``: fetched there, perhaps
    since its last beat. Short reads: a private list holds its jobs in flight."""
    identities = sscan_all(conn, keys.PROCESSES)
    alive = conn.pipeline([("EXISTS", identity) for identity in identities]) if identities else []
    for identity, up in zip(identities, alive, strict=True):
        for queue in sscan_all(conn, keys.wip_queues(identity)) if up else []:
            for raw in conn.call("LRANGE", keys.wip(identity, queue), 0, IN_FLIGHT_READ - 1):
                if jid in text(raw) and _jid_of(text(raw)) == jid:
                    return identity
    return None


def _jid_of(raw: str) -> object:
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return payload.get("jid") if isinstance(payload, dict) else None


def _removed(jobs: SortedSet, jid: str) -> bool:
    entry = jobs.find_job(jid)
    if entry is None:
        return False
    # Replay-safe: the script removes the exact member only once.
    return removal.remove(jobs.runtime, jobs.name, removal.ZSET, [entry.value],
                          removal.Ending(jobs.name, cancelled=True), idempotent=True)[0]

"""Which job holds each unique lock: its class and arguments, and where it waits.

A lock's value is only the holder's jid (Sidekiq Enterprise's format), so an
operator looking at a lock cannot tell what it keeps out. This finds the
holders among what is running now, the schedule, the retry set and the
queues, reading at most :data:`MAX_READ` entries of each place, so a page
of 200 locks costs a bounded number of round trips however big Redis is.

Duties:
1. :func:`holders`: for the jids asked about, the job record found and where
   (``running``, ``scheduled``, ``retry`` or ``queue <name>``); a jid found
   nowhere within the bound is left out (it may have just finished, or sit
   further down a long queue).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from wurk.api.records import JobRecord
from wurk.api.workers import Workers
from wurk.redis.runtime import Runtime, runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.replies import resolve, score_pairs, sscan_all

MAX_READ = 10_000
LIST_PAGE = 1_000
SCAN_STEP = 1_000


@dataclass(frozen=True)
class Holder:
    job: JobRecord
    where: str


def holders(jids: Iterable[str], *, config: Config | None = None) -> dict[str, Holder]:
    cfg = resolve(config)
    runtime = runtime_for(cfg)  # once: the scans below share its pool
    wanted = {jid for jid in jids if jid}
    found: dict[str, Holder] = {}
    for entry in Workers(config=cfg):
        _note(found, wanted, entry.work.job, "running")
    for name, where in ((keys.SCHEDULE, "scheduled"), (keys.RETRY, "retry")):
        if wanted - found.keys():
            for member in runtime.pool.run(functools.partial(_zscan, name=name),
                                           idempotent=True):
                _note(found, wanted, JobRecord(member, config=cfg), where)
    if wanted - found.keys():
        _queued(runtime, wanted, found)
    return found


def _note(found: dict[str, Holder], wanted: set[str], job: JobRecord, where: str) -> None:
    jid = job.jid
    if jid in wanted and jid not in found:
        found[jid] = Holder(job, where)


def _zscan(conn: Any, name: str) -> list[bytes]:
    cursor: Any = b"0"
    members: list[bytes] = []
    while len(members) < MAX_READ:
        cursor, batch = conn.call("ZSCAN", name, cursor, "COUNT", SCAN_STEP)
        members += [member for member, _ in score_pairs(batch)]
        if int(cursor) == 0:
            break
    return members


def _queued(runtime: Runtime, wanted: set[str], found: dict[str, Holder]) -> None:
    cfg = runtime.config
    pool = runtime.pool
    names = pool.run(lambda c: sscan_all(c, keys.QUEUES), idempotent=True)
    for name in sorted(names):
        for start in range(0, MAX_READ, LIST_PAGE):
            values = pool.call("LRANGE", f"queue:{name}", start, start + LIST_PAGE - 1,
                               idempotent=True)
            for value in values:
                _note(found, wanted, JobRecord(value, name, config=cfg), f"queue {name}")
            if len(values) < LIST_PAGE or not wanted - found.keys():
                break
        if not wanted - found.keys():
            return

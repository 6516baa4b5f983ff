"""The chaos runs' job: ``chaos_record(jid, seconds)`` sleeps, then RPUSHes its jid to ``done``.

It records through its own redis-py client on ``CHAOS_DONE_URL`` (one per
process, never one made before a fork), not through the worker's pool: the
chaos test puts a fault proxy between the worker and Redis, and the job's
own bookkeeping must not be what the faults hit, or a lost reply would show
up as a "duplicate" that the fetch path never caused. ``done`` then counts
executions, exactly what lost/duplicate figures are about.

Redis may be restarting while a job records: the job keeps trying for a
minute rather than failing into a retry whose backoff outlives the test. A
try whose reply was lost may have landed, so ``done`` can hold a jid twice
for that reason too; a jid missing from it is a lost job.
"""

from __future__ import annotations

import os
import time

import redis

import wurk

DONE = "done"
JOB = "chaos_record"
_clients: dict[int, redis.Redis] = {}


def _redis() -> redis.Redis:
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        client = redis.Redis.from_url(os.environ["CHAOS_DONE_URL"], socket_timeout=5,
                                      socket_connect_timeout=2)
        _clients[pid] = client
    return client


@wurk.job(name=JOB)
def chaos_record(jid: str, seconds: float = 0.0) -> None:
    if seconds:
        time.sleep(seconds)
    deadline = time.monotonic() + 60
    while True:
        try:
            _redis().rpush(DONE, jid)
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)

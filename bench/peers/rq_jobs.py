"""RQ 3.0 benchmark job and enqueuers.

Bulk enqueue is ``Queue.enqueue_many`` with 1 000 jobs per call (one Redis
pipeline per call); paced enqueue is one ``Queue.enqueue`` per job. Workers:
``rq worker-pool -n 2`` (``-w rq.worker.SimpleWorker`` or the default forking
``Worker``), queue ``default``.
"""

from __future__ import annotations

import time

from redis import Redis
from rq import Queue

from bench.peers.common import paced, redis_url, run_job

BULK = 1000


def bench_job(shape: str, ts: float) -> None:
    run_job(shape, ts)


def _queue() -> Queue:
    conn = Redis.from_url(redis_url())
    conn.ping()
    return Queue("default", connection=conn)


def enqueue_bulk(n: int, shape: str) -> float:
    q = _queue()
    started = time.perf_counter()
    for start in range(0, n, BULK):
        q.enqueue_many([Queue.prepare_data(bench_job, args=(shape, 0))
                        for _ in range(min(BULK, n - start))])
    return time.perf_counter() - started


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    q = _queue()
    return paced(rate, seconds, lambda ts: q.enqueue(bench_job, shape, ts))

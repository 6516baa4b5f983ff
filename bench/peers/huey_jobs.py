"""Huey 3.5 benchmark task and enqueuers (RedisHuey, blocking dequeue).

Enqueue is one task call (one LPUSH) per job; Huey has no bulk enqueue.
Consumer: ``huey_consumer bench.peers.huey_jobs.huey -k process -w 4 -q``.
"""

from __future__ import annotations

import time

from huey import RedisHuey

from bench.peers.common import paced, redis_url, run_job

huey = RedisHuey("bench", url=redis_url())


@huey.task(name="bench_job")
def bench_job(shape: str, ts: float) -> None:
    run_job(shape, ts)


def enqueue_bulk(n: int, shape: str) -> float:
    huey.storage.conn.ping()
    started = time.perf_counter()
    for _ in range(n):
        bench_job(shape, 0)
    return time.perf_counter() - started


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    huey.storage.conn.ping()
    return paced(rate, seconds, lambda ts: bench_job(shape, ts))

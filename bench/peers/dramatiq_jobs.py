"""Dramatiq 2.2 benchmark actor and enqueuers (Redis broker).

Enqueue is one ``send()`` per job (Dramatiq has no bulk send). Worker:
``dramatiq bench.peers.dramatiq_jobs -p 2 -t 32``, default middleware.
"""

from __future__ import annotations

import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers.common import paced, redis_url, run_job

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_job")
def bench_job(shape: str, ts: float) -> None:
    run_job(shape, ts)


def enqueue_bulk(n: int, shape: str) -> float:
    broker.client.ping()
    started = time.perf_counter()
    for _ in range(n):
        bench_job.send(shape, 0)
    return time.perf_counter() - started


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    broker.client.ping()
    return paced(rate, seconds, lambda ts: bench_job.send(shape, ts))

"""wurk's benchmark job and enqueuers (run in the harness's own interpreter).

The job's RPUSH/INCR go through plain redis-py (``bench.peers.common.client``),
as every Python system's job does, so the harness compares what the frameworks
cost and not their Redis clients (wurk's own pool costs less per call). Bulk
enqueue is ``Client.push_bulk`` with 1 000 jobs per call, paced enqueue one
``Client.push`` per job.
"""

from __future__ import annotations

import time

import wurk
from bench.peers.common import paced, redis_url, run_job

BULK = 1000


class BenchJob(wurk.Job, name="BenchJob"):
    def perform(self, shape: str, ts: float) -> None:
        run_job(shape, ts)


def _client() -> wurk.Client:
    client = wurk.Client(wurk.Config(redis_url=redis_url()))
    client.pool.call("PING")
    return client


def enqueue_bulk_of(cls: str, n: int, shape: str) -> float:
    """``n`` jobs of class ``cls`` in ``push_bulk`` calls of BULK; seconds taken."""
    client = _client()
    started = time.perf_counter()
    for start in range(0, n, BULK):
        args = [[shape, 0] for _ in range(min(BULK, n - start))]
        client.push_bulk({"class": cls, "args": args})
    return time.perf_counter() - started


def enqueue_paced_of(cls: str, rate: float, seconds: float, shape: str) -> tuple[int, float]:
    client = _client()
    return paced(rate, seconds, lambda ts: client.push({"class": cls, "args": [shape, ts]}))


def enqueue_bulk(n: int, shape: str) -> float:
    return enqueue_bulk_of("BenchJob", n, shape)


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    return enqueue_paced_of("BenchJob", rate, seconds, shape)

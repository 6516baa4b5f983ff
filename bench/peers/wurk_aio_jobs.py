"""wurk's benchmark coroutine for the asyncio executor, and its enqueuers.

The same job as ``bench.peers.wurk_jobs``, as an ``async def perform``: the
io shape awaits ``asyncio.sleep`` (a blocking sleep would stall the loop),
the cpu shape runs the common loop inside the event loop (as arq's does),
and the RPUSH/INCR go through a plain ``redis.asyncio`` client, one per
process (wurk's own pool is sync), of at most :data:`CONNECTIONS`
connections. Enqueue is as for ``wurk_jobs``.
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aredis

import wurk
from bench.peers.common import DONE_KEY, IO_SECONDS, LAT_KEY, cpu_loop, paced, redis_url

BULK = 1000
CONNECTIONS = 32
_clients: dict[int, aredis.Redis] = {}


def _redis() -> aredis.Redis:
    """One asyncio client per process, made on the executor's loop by its first job."""
    pid = os.getpid()
    if pid not in _clients:
        _clients.clear()
        # Blocking: hundreds of jobs at once wait for one of CONNECTIONS
        # instead of failing with MaxConnectionsError.
        _clients[pid] = aredis.Redis(connection_pool=aredis.BlockingConnectionPool.from_url(
            redis_url(), max_connections=CONNECTIONS))
    return _clients[pid]


class AioBenchJob(wurk.Job, name="AioBenchJob"):
    async def perform(self, shape: str, ts: float) -> None:
        r = _redis()
        if ts:
            await r.rpush(LAT_KEY, time.time() - ts)
        if shape == "cpu":
            cpu_loop()
        elif shape == "io":
            await asyncio.sleep(IO_SECONDS)
        await r.incr(DONE_KEY)


def _client() -> wurk.Client:
    client = wurk.Client(wurk.Config(redis_url=redis_url()))
    client.pool.call("PING")
    return client


def enqueue_bulk(n: int, shape: str) -> float:
    client = _client()
    started = time.perf_counter()
    for start in range(0, n, BULK):
        args = [[shape, 0] for _ in range(min(BULK, n - start))]
        client.push_bulk({"class": "AioBenchJob", "args": args})
    return time.perf_counter() - started


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    client = _client()
    return paced(rate, seconds,
                 lambda ts: client.push({"class": "AioBenchJob", "args": [shape, ts]}))

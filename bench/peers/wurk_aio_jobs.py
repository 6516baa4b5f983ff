"""wurk's benchmark coroutine for the asyncio executor, and its enqueuers.

The same job as ``bench.peers.wurk_jobs``, as an ``async def perform``: the
io shape awaits ``asyncio.sleep`` (a blocking sleep would stall the loop),
the cpu shape runs the common loop inside the event loop (as arq's does).
The RPUSH/INCR go through plain redis-py, as every Python system's job
does (``bench.peers.common.client``: one sync round trip on the loop), or,
with ``BENCH_AIO_REDIS=asyncio`` in the workers' environment, through a
``redis.asyncio`` client per process of at most :data:`CONNECTIONS`
connections (what an asyncio codebase would use; it costs far more CPU per
call on this machine). Enqueue is as for ``wurk_jobs``.
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aredis

import wurk
from bench.peers import wurk_jobs
from bench.peers.common import (
    DONE_KEY,
    EXTRA_INCRS,
    EXTRA_KEY,
    IO_SECONDS,
    LAT_KEY,
    client,
    cpu_loop,
    redis_url,
)

CONNECTIONS = 32
# Read per process: a swarm parent imports this module before the slot's env is set.
ENV_SWITCH = "BENCH_AIO_REDIS"
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


_use_asyncio: dict[int, bool] = {}


def _asyncio_client() -> bool:
    """The switch, read once per process (a child reads its slot's env)."""
    pid = os.getpid()
    if pid not in _use_asyncio:
        _use_asyncio.clear()
        _use_asyncio[pid] = os.environ.get(ENV_SWITCH) == "asyncio"
    return _use_asyncio[pid]


class AioBenchJob(wurk.Job, name="AioBenchJob"):
    async def perform(self, shape: str, ts: float) -> None:
        if _asyncio_client():
            await _async_job(shape, ts)
            return
        r = client()
        if ts:
            r.rpush(LAT_KEY, time.time() - ts)
        await _work(shape)
        for _ in range(EXTRA_INCRS):
            r.incr(EXTRA_KEY)
        r.incr(DONE_KEY)


async def _async_job(shape: str, ts: float) -> None:
    r = _redis()
    if ts:
        await r.rpush(LAT_KEY, time.time() - ts)
    await _work(shape)
    for _ in range(EXTRA_INCRS):
        await r.incr(EXTRA_KEY)
    await r.incr(DONE_KEY)


async def _work(shape: str) -> None:
    if shape == "cpu":
        cpu_loop()
    elif shape == "io":
        await asyncio.sleep(IO_SECONDS)


def enqueue_bulk(n: int, shape: str) -> float:
    return wurk_jobs.enqueue_bulk_of("AioBenchJob", n, shape)


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    return wurk_jobs.enqueue_paced_of("AioBenchJob", rate, seconds, shape)

"""arq 0.28 benchmark coroutine, worker settings and enqueuers.

The job uses the worker's own ArqRedis (``ctx["redis"]``); the io shape awaits
``asyncio.sleep`` (a blocking sleep would stall arq's event loop), the cpu
shape runs the same loop as the other Python systems inside the event loop.
Bulk enqueue is ``enqueue_job`` 100 at a time under ``asyncio.gather`` (arq
has no bulk API); paced enqueue awaits one ``enqueue_job`` per job. Workers:
2 processes of ``arq bench.peers.arq_jobs.WorkerSettings`` with
``max_jobs=100`` and ``poll_delay=0.01`` (arq's defaults, 10 and 0.5 s, make it
idle between polls) and logging at WARNING (arq logs every job at INFO).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

from bench.peers.common import (
    DONE_KEY,
    EXTRA_INCRS,
    EXTRA_KEY,
    IO_SECONDS,
    LAT_KEY,
    cpu_loop,
    redis_url,
)

GATHER = 100


async def bench_job(ctx: dict[str, Any], shape: str, ts: float) -> None:
    r = ctx["redis"]
    if ts:
        await r.rpush(LAT_KEY, time.time() - ts)
    if shape == "cpu":
        cpu_loop()
    elif shape == "io":
        await asyncio.sleep(IO_SECONDS)
    for _ in range(EXTRA_INCRS):
        await r.incr(EXTRA_KEY)
    await r.incr(DONE_KEY)


class WorkerSettings:
    functions = [bench_job]
    redis_settings = RedisSettings.from_dsn(redis_url())
    max_jobs = 100
    poll_delay = 0.01


LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"level": "WARNING", "class": "logging.StreamHandler"}},
    "loggers": {"arq": {"handlers": ["stderr"], "level": "WARNING"}},
}


async def _bulk(n: int, shape: str) -> float:
    pool = await create_pool(RedisSettings.from_dsn(redis_url()))
    await pool.ping()
    started = time.perf_counter()
    for start in range(0, n, GATHER):
        await asyncio.gather(*(pool.enqueue_job("bench_job", shape, 0)
                               for _ in range(min(GATHER, n - start))))
    elapsed = time.perf_counter() - started
    await pool.aclose()
    return elapsed


async def _paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    pool = await create_pool(RedisSettings.from_dsn(redis_url()))
    await pool.ping()
    total = int(rate * seconds)
    started = time.perf_counter()
    for i in range(total):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await pool.enqueue_job("bench_job", shape, time.time())
    elapsed = time.perf_counter() - started
    await pool.aclose()
    return total, elapsed


def enqueue_bulk(n: int, shape: str) -> float:
    return asyncio.run(_bulk(n, shape))


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    return asyncio.run(_paced(rate, seconds, shape))

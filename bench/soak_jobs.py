"""The soak benchmark's jobs (bench/soak.py): one of each kind of work wurk does.

Threads jobs run on ``default``, asyncio jobs on ``aio`` (the swarm's asyncio
slot). Each does next to nothing: the soak measures what wurk keeps, not
what a job costs. ``soak_flaky`` fails half its runs and is retried after 2 s,
so the retry set sees steady traffic without Sidekiq's growing backoff.
"""

from __future__ import annotations

import gc
import linecache
import os
import random
import tracemalloc
from typing import Any

import wurk

LIMIT = wurk.limiter.concurrent("soak-concurrent", 50, lease=30, wait_timeout=5)
BUCKET = wurk.limiter.bucket("soak-bucket", 100_000, interval=1)


def _two_seconds(count: int, exc: BaseException, payload: Any) -> float:
    return 2.0


@wurk.job(name="soak_noop")
def soak_noop(n: int) -> None:
    """A plain job."""


@wurk.job(name="soak_value")
def soak_value(n: int) -> int:
    """A workflow step whose result the next step reads."""
    return n * 2


@wurk.job(name="soak_merge")
def soak_merge(values: list[int]) -> int:
    """The last workflow step: reads the group's results."""
    return sum(values)


@wurk.job(name="soak_callback")
def soak_callback(status: dict[str, Any], tag: str) -> None:
    """A batch callback."""


@wurk.job(name="soak_unique", unique_for=30)
def soak_unique(key: int) -> None:
    """A unique job: duplicates within 30 s are refused at push."""


@wurk.job(name="soak_result", store_result=True, result_ttl=300)
def soak_result(n: int) -> int:
    """A job that keeps its result 5 minutes."""
    return n + 1


@wurk.job(name="soak_limited")
def soak_limited(n: int) -> None:
    """A job that passes two limiters."""
    with LIMIT.acquire(), BUCKET.acquire():
        pass


@wurk.job(name="soak_flaky", retry=25, retry_in=_two_seconds)
def soak_flaky(n: int) -> None:
    """Fails half its runs; retried after 2 s."""
    if random.random() < 0.5:
        raise RuntimeError("soak: a planned failure")


@wurk.job(name="soak_aio_noop", queue="aio")
async def soak_aio_noop(n: int) -> None:
    """A plain asyncio job."""


@wurk.job(name="soak_aio_result", queue="aio", store_result=True, result_ttl=300)
async def soak_aio_result(n: int) -> int:
    """An asyncio job that keeps its result."""
    return n + 1


@wurk.job(name="soak_aio_flaky", queue="aio", retry=25, retry_in=_two_seconds)
async def soak_aio_flaky(n: int) -> None:
    """An asyncio job that fails half its runs."""
    if random.random() < 0.5:
        raise RuntimeError("soak: a planned failure")


@wurk.job(name="soak_aio_unique", queue="aio", unique_for=30)
async def soak_aio_unique(key: int) -> None:
    """A unique asyncio job."""


# --trace: each call of a trace job in a child starts tracemalloc (first call),
# takes the baseline snapshot (second), then writes what grew since the baseline.
_trace: dict[str, Any] = {}


def _trace_step(path: str) -> None:
    if not tracemalloc.is_tracing():
        tracemalloc.start(4)
        return
    gc.collect()
    # Without the tracer's own: tracemalloc, and the source lines its report reads.
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__),
         tracemalloc.Filter(False, linecache.__file__)])
    if "base" not in _trace:
        _trace["base"], _trace["n"] = snap, 0
        return
    _trace["n"] += 1
    grown = snap.compare_to(_trace["base"], "traceback")
    total = sum(s.size_diff for s in grown)
    with open(f"{path}-{os.getpid()}.txt", "a", encoding="utf-8") as out:
        out.write(f"== sample {_trace['n']}: traced memory {total / 1024:+.0f} KiB since the "
                  f"baseline, {sum(s.count_diff for s in grown):+d} blocks\n")
        for stat in grown[:12]:
            out.write(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks\n")
            for frame in stat.traceback.format()[-8:]:
                out.write(f"      {frame}\n")


@wurk.job(name="soak_trace")
def soak_trace(path: str) -> None:
    """A tracemalloc step in the threads child."""
    _trace_step(path)


@wurk.job(name="soak_aio_trace", queue="aio")
async def soak_aio_trace(path: str) -> None:
    """A tracemalloc step in the asyncio child."""
    _trace_step(path)

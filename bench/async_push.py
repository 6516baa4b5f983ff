"""Async pushes against sync pushes, paired round by round in one run.

    python bench/async_push.py [--pushes 5000] [--rounds 5] [--coroutines 50]

Starts a private redis-server (loopback, free port, no persistence), then
alternates, round by round, between four ways of pushing N single jobs:
the sync client from one thread, the AsyncClient awaited one push at a time
(one coroutine, the shape of a request handler), the AsyncClient from many
coroutines at once (``--coroutines``), and ``push_bulk`` of 1,000-job
slices from each client. Prints pushes/s per round, the median of each, and
the median per-round ratio of each async figure to its sync counterpart,
the figure to read on a noisy machine. Checks every job arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import wurk  # noqa: E402
from bench.noop_throughput import redis_server  # noqa: E402

BULK = 1000


def sync_single(client: wurk.Client, n: int) -> None:
    for i in range(n):
        client.push({"class": "Noop", "args": [i]})


def sync_bulk(client: wurk.Client, n: int) -> None:
    for start in range(0, n, BULK):
        client.push_bulk({"class": "Noop",
                          "args": [[i] for i in range(start, min(n, start + BULK))]})


async def async_single(client: wurk.AsyncClient, n: int) -> None:
    for i in range(n):
        await client.push({"class": "Noop", "args": [i]})


async def async_many(client: wurk.AsyncClient, n: int, coroutines: int) -> None:
    async def worker(share: range) -> None:
        for i in share:
            await client.push({"class": "Noop", "args": [i]})
    await asyncio.gather(*(worker(range(k, n, coroutines)) for k in range(coroutines)))


async def async_bulk(client: wurk.AsyncClient, n: int) -> None:
    for start in range(0, n, BULK):
        await client.push_bulk({"class": "Noop",
                                "args": [[i] for i in range(start, min(n, start + BULK))]})


def rate(run: Callable[[], object], n: int, check: redis.Redis) -> float:
    check.delete("queue:default")
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    if check.llen("queue:default") != n:
        sys.exit(f"expected {n} jobs, found {check.llen('queue:default')}")
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=5000)
    parser.add_argument("--bulk-pushes", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--coroutines", type=int, default=50)
    opts = parser.parse_args()
    n, nb = opts.pushes, opts.bulk_pushes
    with redis_server() as server:
        config = wurk.Config(redis_url=server.url, log_level="warning", reliable_push=False,
                             redis_pool_size=opts.coroutines)
        check = redis.Redis.from_url(server.url)
        sync = wurk.Client(config, drain_spool=False)
        loop = asyncio.new_event_loop()
        aio = wurk.AsyncClient(config)
        shapes: dict[str, Callable[[], object]] = {
            "sync single": lambda: sync_single(sync, n),
            "async single": lambda: loop.run_until_complete(async_single(aio, n)),
            f"async x{opts.coroutines}": lambda: loop.run_until_complete(
                async_many(aio, n, opts.coroutines)),
            "sync bulk": lambda: sync_bulk(sync, nb),
            "async bulk": lambda: loop.run_until_complete(async_bulk(aio, nb)),
        }
        figures: dict[str, list[float]] = {name: [] for name in shapes}
        for round_ in range(1, opts.rounds + 1):
            line = []
            for name, run in shapes.items():
                figures[name].append(rate(run, nb if "bulk" in name else n, check))
                line.append(f"{name} {figures[name][-1]:,.0f}/s")
            print(f"round {round_}: " + ", ".join(line), flush=True)
        loop.run_until_complete(aio.aclose())
        loop.close()
    print("\nmedian pushes/s: " + ", ".join(
        f"{name} {statistics.median(values):,.0f}" for name, values in figures.items()))
    for aname, sname in (("async single", "sync single"),
                         (f"async x{opts.coroutines}", "sync single"),
                         ("async bulk", "sync bulk")):
        ratios = [a / s for a, s in zip(figures[aname], figures[sname], strict=True)]
        print(f"{aname} / {sname}: median ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()

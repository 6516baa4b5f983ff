"""What an ``async def`` job costs in the threads executor, against a sync job.

``python bench/async_jobs.py [--jobs N] [--concurrency C]`` prints

1. the in-process hop alone: calling a trivial job directly, against running
   a trivial coroutine on the process's loop and waiting for it
   (``wurk.runtime.event_loop.run``), from 1 thread and from 8 at once;
2. drains of N jobs by one in-process Launcher on a private redis-server
   (started here, no persistence), sync against async, for the noop shape
   and the io shape (a 10 ms ``time.sleep`` / ``asyncio.sleep``), in
   jobs/s, paired in one sitting.

In this executor an async job still holds one processor thread while it
runs, so the io shape is bounded by ``concurrency`` either way; the figure
shows what the hop to the loop costs, not what an asyncio executor would
gain.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

import wurk
from wurk.redis.runtime import close_runtime
from wurk.runtime import event_loop
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config


def per_call(fn: Callable[[], object], runs: int, threads: int = 1) -> float:
    """Best of three passes, in microseconds per call (wall time over all threads)."""
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=lambda: [fn() for _ in range(runs)])
                   for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = min(best, (time.perf_counter() - started) / (runs * threads))
    return best * 1e6


async def trivial() -> None:
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def drain(config: Config, r: redis.Redis, job: Any, jobs: int, args: list[Any]) -> float:
    r.flushall()
    job.perform_bulk([args] * jobs)
    launcher = Launcher(config)
    started = time.perf_counter()
    launcher.start()
    try:
        while int(r.get("bench:done") or 0) < jobs:
            time.sleep(0.005)
        return jobs / (time.perf_counter() - started)
    finally:
        launcher.stop(time.monotonic() + 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20_000)
    options = parser.parse_args()

    def nothing() -> None:
        return None

    print(f"{'direct call, 1 thread':40} {per_call(nothing, options.runs):8.2f} us/job")
    print(f"{'event_loop.run hop, 1 thread':40} "
          f"{per_call(lambda: event_loop.run(trivial()), options.runs):8.2f} us/job")
    print(f"{'event_loop.run hop, 8 threads':40} "
          f"{per_call(lambda: event_loop.run(trivial()), options.runs // 8, 8):8.2f} us/job (wall)")

    drains(options.jobs, options.concurrency)


def wait_ready(r: redis.Redis) -> None:
    while True:
        try:
            r.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)


def drains(jobs: int, concurrency: int) -> None:
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="wurk-bench-")
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                               str(port), "--save", "", "--appendonly", "no", "--dir", workdir],
                              stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        r = redis.Redis.from_url(url)
        wait_ready(r)
        config = Config(redis_url=url, concurrency=concurrency, log_level="warning",
                        fetch_timeout=0.5)
        wurk.configure(config)
        counter = redis.Redis.from_url(url)  # plain redis-py, as the harness's jobs do
        lock = threading.Lock()

        def count() -> None:
            with lock:
                counter.incr("bench:done")

        @wurk.job(name="bench_sync")
        def sync_job(seconds: float) -> None:
            if seconds:
                time.sleep(seconds)
            count()

        @wurk.job(name="bench_async")
        async def async_job(seconds: float) -> None:
            if seconds:
                await asyncio.sleep(seconds)
            count()

        for shape, seconds in (("noop", 0.0), ("io 10 ms", 0.01)):
            for _ in range(2):  # paired: sync, async, sync, async
                for name, job in (("sync", sync_job), ("async", async_job)):
                    rate = drain(config, r, job, jobs, [seconds])
                    print(f"{shape:9} {name:6} c={concurrency:<4} {rate:10,.0f} jobs/s")
        close_runtime(config)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

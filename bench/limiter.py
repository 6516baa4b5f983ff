"""What a limiter costs: one check (and release) alone, and a job with vs without one.

    python bench/limiter.py [--ops 5000] [--jobs 5000] [--rounds 3]

What it does:
1. Starts its own redis-server (free loopback port, temp dir, no persistence).
2. For each kind (concurrent, window, bucket, leaky), never over its limit:
   ``--ops`` times ``with limiter.acquire(): pass`` in one thread; prints the
   mean time and the round trips per acquire+release (counted at wurk's
   connection, ``Conn.call`` and ``Conn.pipeline``), next to a PING's time.
3. Jobs, paired in one run: ``--rounds`` rounds, each pushing ``--jobs``
   no-op jobs, ``--jobs`` jobs whose body is ``with limiter.acquire(): pass``
   on a concurrent limiter of 1000 (check and release: two round trips) and
   as many on a window limiter of a million a second (one round trip), in
   rotating order, each batch drained by an in-process worker of 10
   threads; prints each drain rate and the worker's round trips per job.
Exits 0; the figures are for reading, not for a gate.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import wurk  # noqa: E402
from wurk.redis.connection import Conn  # noqa: E402
from wurk.redis.runtime import close_runtime, runtime_for  # noqa: E402
from wurk.runtime.launcher import Launcher  # noqa: E402
from wurk.settings.config import Config  # noqa: E402

LIMIT = 1000
_done = 0
_done_lock = threading.Lock()
LIMITER = wurk.limiter.concurrent("bench-jobs", LIMIT, lease=60)
WINDOW = wurk.limiter.window("bench-window", 1_000_000, interval=1)
_trips = itertools.count()


def _counted(method: Callable[..., Any]) -> Callable[..., Any]:
    def counting(self: Conn, *args: Any, **kwargs: Any) -> Any:
        next(_trips)
        return method(self, *args, **kwargs)
    return counting


Conn.call = _counted(Conn.call)  # type: ignore[method-assign]
Conn.pipeline = _counted(Conn.pipeline)  # type: ignore[method-assign]


def trips() -> int:
    """Round trips made through wurk's connections so far (count() peeks by advancing)."""
    return next(_trips)


def _count() -> None:
    global _done  # noqa: PLW0603 - the bench's own tally
    with _done_lock:
        _done += 1


@wurk.job(name="bench_limiter_plain", retry=False)
def plain() -> None:
    _count()


@wurk.job(name="bench_limiter_limited", retry=False)
def limited() -> None:
    with LIMITER.acquire():
        pass
    _count()


@wurk.job(name="bench_limiter_window", retry=False)
def windowed() -> None:
    with WINDOW.acquire():
        pass
    _count()


@contextlib.contextmanager
def redis_server() -> Iterator[redis.Redis]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    workdir = tempfile.mkdtemp(prefix="wurk-bench-limiter-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    try:
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.02)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def per_check(client: redis.Redis, kind: str, ops: int) -> tuple[float, float]:
    """Mean seconds and round trips per acquire+release, never refused."""
    options: dict[str, Any] = {} if kind == "concurrent" else {"interval": 3600}
    limiter = getattr(wurk.limiter, kind)(f"bench-{kind}", ops + 10, **options)
    with limiter.acquire():  # the first check also registers the limiter: not measured
        pass
    before = trips()
    started = time.perf_counter()
    for _ in range(ops):
        with limiter.acquire():
            pass
    elapsed = time.perf_counter() - started
    return elapsed / ops, (trips() - before - 1) / ops


def drain(config: Config, client: redis.Redis, job: Callable[..., Any] | Any,
          count: int) -> tuple[float, float]:
    """Push ``count`` jobs, drain them with a fresh worker: (jobs per second, round
    trips per job, counting the worker's own: fetch, acks, heartbeat)."""
    global _done  # noqa: PLW0603
    client.flushall()
    _done = 0
    for _ in range(count):
        job.perform_async()
    before = trips()
    launcher = Launcher(config)
    started = time.perf_counter()
    launcher.start()
    while _done < count:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    used = trips() - before - 1
    launcher.stop(time.monotonic() + 5)
    return count / elapsed, used / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with redis_server() as client:
        port = client.connection_pool.connection_kwargs["port"]
        config = Config(redis_url=f"redis://127.0.0.1:{port}/0", concurrency=10,
                        log_level="error", heartbeat_interval=5.0)
        wurk.configure(config)
        print(f"one acquire+release, {args.ops} times in one thread (never refused):")
        started = time.perf_counter()
        for _ in range(args.ops):
            runtime_for(config).pool.call("PING", idempotent=True)
        print(f"  (a PING through the same pool, for scale: "
              f"{(time.perf_counter() - started) / args.ops * 1e6:.1f} us)")
        for kind in ("concurrent", "window", "bucket", "leaky"):
            seconds, used = per_check(client, kind, args.ops)
            print(f"  {kind:11} {seconds * 1e6:7.1f} us   {used:.2f} round trips")
        jobs = [("plain", plain), ("window", windowed), ("concurrent", limited)]
        rates: dict[str, list[float]] = {name: [] for name, _ in jobs}
        costs: dict[str, list[float]] = {name: [] for name, _ in jobs}
        for index in range(args.rounds):
            for name, job in jobs[index % 3:] + jobs[:index % 3]:
                rate, used = drain(config, client, job, args.jobs)
                rates[name].append(rate)
                costs[name].append(used)
        print(f"\njobs, {args.rounds} rounds of {args.jobs} each (10 threads, reliable fetch):")
        for name, _ in jobs:
            print(f"  {name:10} {statistics.median(rates[name]):8.0f} jobs/s (median of "
                  f"{', '.join(f'{r:.0f}' for r in rates[name])})   "
                  f"{statistics.median(costs[name]):.2f} round trips/job")
        close_runtime(config)


if __name__ == "__main__":
    main()

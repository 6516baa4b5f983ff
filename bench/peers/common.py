"""What every Python system's benchmark job does, and the enqueuers' pacing.

The job takes two arguments, ``shape`` and ``ts``:

* ``ts`` (float epoch seconds, or 0): when non-zero the job first RPUSHes
  ``now - ts`` (push-to-start latency, seconds) to ``LAT_KEY``;
* ``shape`` picks the work: ``noop`` nothing, ``cpu`` a fixed arithmetic loop
  of about 2 ms that holds the GIL, ``io`` ``sleep(0.01)``;
* then it INCRs ``DONE_KEY``, which the harness polls. With
  ``BENCH_EXTRA_INCRS=N`` in the environment (``harness.py --extra-incrs``)
  it first INCRs ``EXTRA_KEY`` N times: running a system with 0 and 1
  tells what one such call costs inside that system's worker, and so what
  the framework costs apart from the job.

Only the standard library and redis-py are used here, so the peers'
virtualenvs (which do not have wurk) can import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import redis

DONE_KEY = "bench:done"
LAT_KEY = "bench:lat"
EXTRA_KEY = "bench:extra"
EXTRA_INCRS = int(os.environ.get("BENCH_EXTRA_INCRS", "0"))
SHAPES = ("noop", "cpu", "io")

# About 2 ms of CPython 3.11 bytecode on the project's machine (2 vCPU);
# bench/peers/sidekiq_jobs.rb scales its own count to the same ~2 ms in Ruby.
CPU_ITERATIONS = 36_000
IO_SECONDS = 0.010


def cpu_loop(n: int = CPU_ITERATIONS) -> int:
    x = 0
    for i in range(n):
        x = (x + i * i) % 1000003
    return x


def work(shape: str) -> None:
    """The job's body before its INCR (synchronous systems)."""
    if shape == "cpu":
        cpu_loop()
    elif shape == "io":
        time.sleep(IO_SECONDS)


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


_clients: dict[int, redis.Redis] = {}


def client() -> redis.Redis:
    """One redis-py client per process (a forked child builds its own)."""
    pid = os.getpid()
    if pid not in _clients:
        _clients.clear()
        _clients[pid] = redis.Redis.from_url(redis_url())
    return _clients[pid]


def run_job(shape: str, ts: float) -> None:
    """The whole job for the synchronous Python systems."""
    r = client()
    if ts:
        r.rpush(LAT_KEY, time.time() - ts)
    work(shape)
    for _ in range(EXTRA_INCRS):
        r.incr(EXTRA_KEY)
    r.incr(DONE_KEY)


def paced(rate: float, seconds: float, push: Callable[[float], object]) -> tuple[int, float]:
    """Call ``push(time.time())`` ``rate * seconds`` times on a fixed schedule.

    Returns (jobs pushed, seconds taken). When a push is late the next ones go
    out back to back until the schedule is caught up (no pushes are dropped).
    """
    total = int(rate * seconds)
    started = time.perf_counter()
    for i in range(total):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        push(time.time())
    return total, time.perf_counter() - started

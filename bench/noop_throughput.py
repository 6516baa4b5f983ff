"""No-op throughput: how fast wurk enqueues and drains jobs that do nothing.

    python bench/noop_throughput.py [--jobs 20000] [--runs 3] [--concurrency 10]
                                    [--fetch reliable|basic|both]
    python -m bench.noop_throughput ...        (the same, from the repo root)

Each run:
1. Flushes a private redis-server (free loopback port, temp dir, no
   persistence) that this script starts and stops itself.
2. Enqueues N ``NoopJob`` jobs with ``Client.push_bulk``, 1 000 per call, and
   reports enqueue jobs/s.
3. Starts ONE ``wurk run -c 10 -r bench.jobs --log-level warning`` process
   and polls the ``bench:done`` counter the jobs INCR. Process jobs/s is
   N / (time from starting the worker command to the last job done), so
   interpreter start-up and boot are included, as in the peers' figures.
   Also reported: boot (start to first job done), steady jobs/s (first to
   last job), the worker's peak RSS, and CPU per job for the worker and Redis.
4. Stops the worker with SIGTERM and checks it exits 0.

Then prints median/min/max over the runs. With ``--fetch both`` each run
drains once with reliable fetch and once with basic fetch (order alternating)
and the paired reliable/basic ratios are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import redis

import wurk

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: make ``bench.jobs`` importable
    sys.path.insert(0, str(ROOT))

from bench.jobs import DONE_KEY  # noqa: E402

BULK = 1000
POLL = 0.005


@dataclass
class Result:
    enqueue_per_s: float
    process_per_s: float
    steady_per_s: float
    boot_s: float
    peak_rss_mb: float
    worker_cpu_us_per_job: float
    redis_cpu_us_per_job: float


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server(*extra: str) -> Iterator[Server]:
    """A private redis-server on a free loopback port; ``extra`` are more flags."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install -y redis-server)")
    workdir = tempfile.mkdtemp(prefix="wurk-bench-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    server = Server(proc, f"redis://127.0.0.1:{port}/0")
    try:
        wait_for_ping(server)
        yield server
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def wait_for_ping(server: Server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.client().ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def enqueue(url: str, jobs: int) -> float:
    """Push ``jobs`` no-op jobs, ``BULK`` per push_bulk call; returns jobs/s."""
    client = wurk.Client(wurk.Config(redis_url=url))
    started = time.perf_counter()
    for start in range(0, jobs, BULK):
        args = [[i] for i in range(start, min(start + BULK, jobs))]
        client.push_bulk({"class": "NoopJob", "args": args})
    elapsed = time.perf_counter() - started
    client.pool.close()
    return jobs / elapsed


def worker_command(concurrency: int) -> list[str]:
    return [sys.executable, "-m", "wurk.cli", "run", "-c", str(concurrency),
            "-r", "bench.jobs", "--log-level", "warning"]


def worker_env(url: str, reliable: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env["REDIS_URL"] = url
    env["WURK_RELIABLE_FETCH"] = "true" if reliable else "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def drain(server: Server, jobs: int, concurrency: int, timeout: float,
          reliable: bool) -> Result:
    """Start one worker, wait for ``jobs`` INCRs, stop it; enqueue rate left at 0."""
    r = server.client()
    redis_proc = psutil.Process(server.proc.pid)
    redis_cpu = sum(redis_proc.cpu_times()[:2])
    started = time.perf_counter()
    worker = subprocess.Popen(worker_command(concurrency), cwd=ROOT,
                              env=worker_env(server.url, reliable))
    try:
        first, last, peak = watch(worker, r, jobs, started + timeout)
        worker_cpu = sum(psutil.Process(worker.pid).cpu_times()[:2])
        redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu
    finally:
        stop(worker)
    return Result(
        enqueue_per_s=0.0,
        process_per_s=jobs / (last - started),
        steady_per_s=jobs / (last - first) if last > first else float("nan"),
        boot_s=first - started,
        peak_rss_mb=peak / 2**20,
        worker_cpu_us_per_job=worker_cpu / jobs * 1e6,
        redis_cpu_us_per_job=redis_cpu / jobs * 1e6,
    )


def watch(worker: subprocess.Popen[bytes], r: redis.Redis, jobs: int,
          deadline: float) -> tuple[float, float, int]:
    """Poll the done counter; returns (first job done, last job done, peak RSS)."""
    proc = psutil.Process(worker.pid)
    first = 0.0
    peak = 0
    while True:
        done = int(r.get(DONE_KEY) or 0)
        now = time.perf_counter()
        if done and not first:
            first = now
        peak = max(peak, proc.memory_info().rss)
        if done >= jobs:
            return first, now, peak
        if worker.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.returncode} after {done} jobs")
        if now > deadline:
            raise RuntimeError(f"timed out with {done} of {jobs} jobs done")
        time.sleep(POLL)


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(40)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise RuntimeError("worker ignored SIGTERM for 40 s") from None
    if worker.returncode != 0:
        raise RuntimeError(f"worker exited with status {worker.returncode} after SIGTERM")


def one_run(server: Server, jobs: int, concurrency: int, timeout: float,
            reliable: bool = True) -> Result:
    server.client().flushall()
    enqueue_rate = enqueue(server.url, jobs)
    result = drain(server, jobs, concurrency, timeout, reliable)
    result.enqueue_per_s = enqueue_rate
    return result


ROWS = [
    ("enqueue jobs/s (push_bulk x1000)", "enqueue_per_s", "{:,.0f}"),
    ("process jobs/s (start -> all done)", "process_per_s", "{:,.0f}"),
    ("steady jobs/s (1st -> last job)", "steady_per_s", "{:,.0f}"),
    ("boot s (start -> 1st job done)", "boot_s", "{:.2f}"),
    ("worker peak RSS MB", "peak_rss_mb", "{:.1f}"),
    ("worker CPU us/job", "worker_cpu_us_per_job", "{:,.0f}"),
    ("redis CPU us/job", "redis_cpu_us_per_job", "{:,.0f}"),
]


def report(results: list[Result], jobs: int, concurrency: int, fetch: str) -> None:
    print(f"\nwurk {wurk.__version__}, 1 x `wurk run -c {concurrency}`, {fetch} fetch, "
          f"{jobs:,} no-op jobs, {len(results)} run(s), Python {sys.version.split()[0]}")
    print(f"{'':36} {'median':>10} {'min':>10} {'max':>10}")
    for label, attr, fmt in ROWS:
        values = [getattr(r, attr) for r in results]
        cells = [fmt.format(v) for v in (statistics.median(values), min(values), max(values))]
        print(f"{label:36} {cells[0]:>10} {cells[1]:>10} {cells[2]:>10}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--concurrency", type=int, default=10, help="worker threads (default 10)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one drain may take before the run fails (default 300)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--fetch", choices=("reliable", "basic", "both"), default="reliable",
                        help="fetch strategy; 'both' alternates them run by run and prints "
                             "the paired ratio (default reliable)")
    args = parser.parse_args()
    if args.jobs < 1 or args.runs < 1:
        parser.error("--jobs and --runs must be at least 1")
    kinds = ["reliable", "basic"] if args.fetch == "both" else [args.fetch]
    results: dict[str, list[Result]] = {kind: [] for kind in kinds}
    with redis_server() as server:
        for n in range(1, args.runs + 1):
            # Alternate which goes first, so drift in the machine's load is shared.
            for kind in kinds if n % 2 else kinds[::-1]:
                result = one_run(server, args.jobs, args.concurrency, args.timeout,
                                 reliable=kind == "reliable")
                print(f"run {n} ({kind}): enqueue {result.enqueue_per_s:,.0f}/s, "
                      f"process {result.process_per_s:,.0f}/s, "
                      f"steady {result.steady_per_s:,.0f}/s, "
                      f"peak RSS {result.peak_rss_mb:.1f} MB", flush=True)
                results[kind].append(result)
    for kind in kinds:
        report(results[kind], args.jobs, args.concurrency, kind)
    if args.fetch == "both":
        for label, attr in (("process", "process_per_s"), ("steady", "steady_per_s")):
            ratios = [getattr(r, attr) / getattr(b, attr)
                      for r, b in zip(results["reliable"], results["basic"], strict=True)]
            print(f"reliable/basic {label} jobs/s, median of paired runs: "
                  f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, "
                  f"max {max(ratios):.2f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({kind: [asdict(r) for r in rs]
                                         for kind, rs in results.items()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

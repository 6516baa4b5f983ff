"""What job results cost: no-op jobs with results off, on, and (optionally)
on a build without the results code at all, paired in one run.

    python bench/results_overhead.py [--jobs 20000] [--runs 3] [--concurrency 10]
                                     [--base-ref main | --no-base]

Each round drains the same number of ``NoopJob`` jobs once per mode, in a
rotating order, on one private redis-server (``noop_throughput``'s):

* ``off``:  this tree, jobs pushed without ``result_ttl``;
* ``on``:   this tree, jobs pushed with ``result_ttl`` (store_result=True);
* ``base``: wurk and bench extracted from ``--base-ref`` (git archive),
  jobs without ``result_ttl``: the same drain before results existed.

Per mode: steady jobs/s (first to last job done), process jobs/s (worker
start to last job), worker CPU and Redis CPU per job, and Redis commands
per job from ``INFO commandstats`` (scripts' inner commands included; the
bench's own polling GETs and INFO left out). Printed: medians over the
rounds and the median of the paired on/off and off/base ratios. Last,
what a job with results off pays in the processor, timed alone: the two
``"result_ttl" in job`` checks (one before the run, one at its end).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import timeit
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

import wurk

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.noop_throughput import BULK, redis_server, stop, watch  # noqa: E402

MODES = ("off", "on", "base")


@dataclass
class Figures:
    steady_per_s: float
    process_per_s: float
    worker_cpu_us: float
    redis_cpu_us: float
    calls_per_job: float


def enqueue(url: str, jobs: int, with_results: bool) -> None:
    client = wurk.Client(wurk.Config(redis_url=url))
    extra = {"result_ttl": 600} if with_results else {}
    for start in range(0, jobs, BULK):
        args = [[i] for i in range(start, min(start + BULK, jobs))]
        client.push_bulk({"class": "NoopJob", "args": args, **extra})
    client.pool.close()


def extract(ref: str, into: Path) -> Path:
    done = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref,
                           "wurk", "bench"], capture_output=True, timeout=60, check=True)
    src = into / "base-src"
    src.mkdir()
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(src, filter="data")
    return src


def env_for(url: str, first: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env["REDIS_URL"] = url
    paths = [str(first)] if first else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    return env


def check_source(env: dict[str, str], expect: Path) -> None:
    where = subprocess.run([sys.executable, "-c", "import wurk; print(wurk.__file__)"],
                           env=env, capture_output=True, text=True, check=True,
                           cwd=tempfile.gettempdir()).stdout.strip()
    if not where.startswith(str(expect)):
        raise SystemExit(f"the worker would import wurk from {where}, not {expect}")


def commands(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k not in ("cmdstat_get", "cmdstat_info", "cmdstat_config"))


def drain(server: object, url: str, jobs: int, concurrency: int, env: dict[str, str],
          timeout: float) -> Figures:
    r = redis.Redis.from_url(url)
    redis_proc = psutil.Process(server.proc.pid)  # type: ignore[attr-defined]
    r.config_resetstat()
    redis_cpu = sum(redis_proc.cpu_times()[:2])
    started = time.perf_counter()
    worker = subprocess.Popen([sys.executable, "-m", "wurk.cli", "run", "-c", str(concurrency),
                               "-r", "bench.jobs", "--log-level", "warning"],
                              cwd=tempfile.gettempdir(), env=env)
    try:
        first, last, _ = watch(worker, r, jobs, started + timeout)
        calls = commands(r)
        worker_cpu = sum(psutil.Process(worker.pid).cpu_times()[:2])
        redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu
    finally:
        stop(worker)
        r.close()
    return Figures(jobs / (last - first), jobs / (last - started), worker_cpu / jobs * 1e6,
                   redis_cpu / jobs * 1e6, calls / jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--base-ref", default="main")
    parser.add_argument("--no-base", action="store_true")
    args = parser.parse_args()
    modes = ("off", "on") if args.no_base else MODES
    figures: dict[str, list[Figures]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="wurk-bench-results-") as scratch, \
            redis_server() as server:
        base = None if args.no_base else extract(args.base_ref, Path(scratch))
        envs = {"off": env_for(server.url, None), "on": env_for(server.url, None)}
        check_source(envs["off"], ROOT / "wurk")
        if base is not None:
            envs["base"] = env_for(server.url, base)
            check_source(envs["base"], base)
        for round_ in range(args.runs):
            order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
            for mode in order:
                server.client().flushall()
                enqueue(server.url, args.jobs, mode == "on")
                got = drain(server, server.url, args.jobs, args.concurrency, envs[mode],
                            args.timeout)
                figures[mode].append(got)
                print(f"round {round_ + 1} {mode:4}: steady {got.steady_per_s:8.0f} jobs/s, "
                      f"process {got.process_per_s:8.0f} jobs/s, worker "
                      f"{got.worker_cpu_us:6.1f} us/job, redis {got.redis_cpu_us:6.1f} us/job, "
                      f"{got.calls_per_job:.2f} commands/job", flush=True)
    report(figures, modes, args)


def report(figures: dict[str, list[Figures]], modes: tuple[str, ...],
           args: argparse.Namespace) -> None:
    print(f"\n{args.jobs} jobs x {args.runs} rounds, concurrency {args.concurrency}; medians:")
    for mode in modes:
        runs = figures[mode]
        print(f"  {mode:4}: steady {statistics.median(f.steady_per_s for f in runs):8.0f} "
              f"jobs/s, worker {statistics.median(f.worker_cpu_us for f in runs):6.1f} us/job, "
              f"redis {statistics.median(f.redis_cpu_us for f in runs):6.1f} us/job, "
              f"{statistics.median(f.calls_per_job for f in runs):.2f} commands/job")
    pairs = [("on", "off")] + ([("off", "base")] if "base" in modes else [])
    for a, b in pairs:
        ratio = statistics.median(x.steady_per_s / y.steady_per_s
                                  for x, y in zip(figures[a], figures[b], strict=True))
        cpu = statistics.median(x.worker_cpu_us / y.worker_cpu_us
                                for x, y in zip(figures[a], figures[b], strict=True))
        print(f"  {a}/{b}: steady throughput x{ratio:.3f}, worker CPU per job x{cpu:.3f}")
    job = {"class": "NoopJob", "args": [1], "queue": "default", "retry": True,
           "jid": "0123456789abcdef01234567", "created_at": 1.0, "enqueued_at": 1.0}
    loops = 1_000_000
    checks = timeit.timeit('"result_ttl" in job and 1; "result_ttl" in job and 1',
                           globals={"job": job}, number=loops)
    print(f"  results off, per job in the processor: {checks / loops * 1e9:.0f} ns "
          "(two dict lookups)")


if __name__ == "__main__":
    main()

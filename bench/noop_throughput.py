"""No-op throughput: how fast wurk enqueues and drains jobs that do nothing.

    python bench/noop_throughput.py [--jobs 20000] [--runs 3] [--concurrency 10]
                                    [--fetch reliable|basic|both] [--swarm N]
                                    [--log-level warning|info,warning] [--tree DIR ...]
    python -m bench.noop_throughput ...        (the same, from the repo root)

Each run:
1. Flushes a private redis-server (free loopback port, temp dir, no
   persistence) that this script starts and stops itself.
2. Enqueues N ``NoopJob`` jobs with ``Client.push_bulk``, 1 000 per call, and
   reports enqueue jobs/s.
3. Starts ONE ``wurk run -c 10 -r bench.jobs --log-level warning`` process
   (or, with ``--swarm N``, a ``wurk-swarm`` of one slot of N children) with
   its stderr sent to a file, and polls the ``bench:done`` counter the jobs
   INCR. Process jobs/s is
   N / (time from starting the worker command to the last job done), so
   interpreter start-up and boot are included, as in the peers' figures.
   Also reported: boot (start to first job done), steady jobs/s (first to
   last job), the worker's peak RSS, and CPU per job for the worker and Redis.
4. Stops the worker with SIGTERM, checks it exits 0 and, at info level or
   below, that its log holds exactly one ``job.done`` line per job.

Then prints median/min/max over the runs. Every combination of ``--fetch``
(``both``: reliable and basic), ``--log-level`` (two comma-separated levels:
both) and ``--tree`` (the wurk source trees to run the workers from, e.g. a
second worktree at the branch point) drains once per run, the order reversed
on every other run (ABBA), and the paired ratios (reliable/basic, first
level/second level) are printed per tree.
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
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from itertools import product
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
    log_lines: int = 0


@dataclass(frozen=True)
class Variant:
    """One way of running the workers; each run drains once per variant."""

    reliable: bool = True
    level: str = "warning"
    tree: Path = ROOT
    swarm: int = 0
    labels: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return " ".join(self.labels) or "reliable"


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


# Runs a module as __main__ with wurk and supervisor from PYTHONPATH: a venv's
# editable install of wurk puts a finder on sys.meta_path that would win over
# PYTHONPATH, and so would the working directory ``-c`` puts first on
# sys.path; --tree would then run this tree's code under another name.
BOOT = ("import runpy, sys; "
        "sys.path[:] = [p for p in sys.path if p != '']; "
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
        "getattr(f, '__module__', '') + getattr(type(f), '__module__', '')]; "
        "module = sys.argv.pop(1); runpy.run_module(module, run_name='__main__', alter_sys=True)")


def check_tree(tree: Path, url: str) -> None:
    """Fail unless a worker started for ``tree`` imports wurk from that tree."""
    variant = Variant(tree=tree)
    code = BOOT.split("module = ", maxsplit=1)[0] + "import wurk; print(wurk.__file__)"
    with tempfile.TemporaryDirectory() as scratch:
        found = subprocess.run([sys.executable, "-c", code], cwd=scratch, check=True,
                               env=worker_env(url, variant), capture_output=True,
                               text=True).stdout.strip()
    if Path(found).resolve() != (tree / "wurk" / "__init__.py").resolve():
        raise SystemExit(f"--tree {tree}: a worker would import wurk from {found}")


def worker_command(concurrency: int, variant: Variant, scratch: Path) -> list[str]:
    if not variant.swarm:
        return [sys.executable, "-c", BOOT, "wurk.cli", "run", "-c", str(concurrency),
                "-r", "bench.jobs", "--log-level", variant.level]
    topology = scratch / "topology.toml"
    topology.write_text(
        '[wurk]\nrequire = ["bench.jobs"]\n'
        f'reliable_fetch = {"true" if variant.reliable else "false"}\n'
        f'log_level = "{variant.level}"\n\n'
        f'[[slot]]\nname = "bench"\ncount = {variant.swarm}\n'
        f'concurrency = {concurrency}\nqueues = ["default"]\n')
    return [sys.executable, "-c", BOOT, "supervisor.cli", "--topology", str(topology)]


def worker_env(url: str, variant: Variant) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env["REDIS_URL"] = url
    env["WURK_RELIABLE_FETCH"] = "true" if variant.reliable else "false"
    # The tree's wurk and supervisor first; bench.jobs is found in either tree.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(variant.tree), str(ROOT), env.get("PYTHONPATH")]))
    return env


def tree_cpu(proc: psutil.Process) -> float:
    """User + system seconds of a process and its live children."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        with suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def drain(server: Server, jobs: int, concurrency: int, timeout: float,
          variant: Variant) -> Result:
    """Start the workers, wait for ``jobs`` INCRs, stop them; enqueue rate left at 0."""
    r = server.client()
    redis_proc = psutil.Process(server.proc.pid)
    redis_cpu = sum(redis_proc.cpu_times()[:2])
    scratch = Path(tempfile.mkdtemp(prefix="wurk-bench-worker-"))
    log_path = scratch / "worker.log"
    try:
        with log_path.open("wb") as log_file:
            started = time.perf_counter()
            worker = subprocess.Popen(worker_command(concurrency, variant, scratch), cwd=scratch,
                                      env=worker_env(server.url, variant), stderr=log_file)
            try:
                first, last, peak = watch(worker, r, jobs, started + timeout)
                worker_cpu = tree_cpu(psutil.Process(worker.pid))
                redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu
            finally:
                stop(worker, log_path)
        log_lines = check_log(log_path, jobs, variant.level)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Result(
        enqueue_per_s=0.0,
        process_per_s=jobs / (last - started),
        steady_per_s=jobs / (last - first) if last > first else float("nan"),
        boot_s=first - started,
        peak_rss_mb=peak / 2**20,
        worker_cpu_us_per_job=worker_cpu / jobs * 1e6,
        redis_cpu_us_per_job=redis_cpu / jobs * 1e6,
        log_lines=log_lines,
    )


def check_log(path: Path, jobs: int, level: str) -> int:
    """The log's line count; at info or below, exactly one whole job.done line per job."""
    lines = path.read_bytes().splitlines()
    if level in ("debug", "info"):
        done = sum(1 for line in lines if b'"job.done"' in line or b" job.done " in line)
        if done != jobs:
            raise RuntimeError(f"the worker logged {done} job.done lines for {jobs} jobs")
    return len(lines)


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
        peak = max(peak, largest_rss(proc))
        if done >= jobs:
            return first, now, peak
        if worker.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.returncode} after {done} jobs")
        if now > deadline:
            raise RuntimeError(f"timed out with {done} of {jobs} jobs done")
        time.sleep(POLL)


def largest_rss(proc: psutil.Process) -> int:
    """The largest RSS among a process and its children (a swarm's busiest child)."""
    peak = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with suppress(psutil.NoSuchProcess):
            peak = max(peak, child.memory_info().rss)
    return peak


def stop(worker: subprocess.Popen[bytes], log_path: Path) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(40)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise RuntimeError("worker ignored SIGTERM for 40 s") from None
    if worker.returncode != 0:
        tail = log_path.read_bytes()[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"worker exited with status {worker.returncode} after SIGTERM; "
                           f"its log ends with:\n{tail}")


def one_run(server: Server, jobs: int, concurrency: int, timeout: float,
            variant: Variant = Variant()) -> Result:
    server.client().flushall()
    enqueue_rate = enqueue(server.url, jobs)
    result = drain(server, jobs, concurrency, timeout, variant)
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
    ("worker log lines", "log_lines", "{:,.0f}"),
]


def report(results: list[Result], jobs: int, concurrency: int, variant: Variant) -> None:
    shape = (f"wurk-swarm of {variant.swarm} x -c {concurrency}" if variant.swarm
             else f"1 x `wurk run -c {concurrency}`")
    print(f"\n{variant.name}: {shape}, {'reliable' if variant.reliable else 'basic'} fetch, "
          f"log level {variant.level}, wurk from {variant.tree}, {jobs:,} no-op jobs, "
          f"{len(results)} run(s), Python {sys.version.split()[0]}")
    print(f"{'':36} {'median':>10} {'min':>10} {'max':>10}")
    for label, attr, fmt in ROWS:
        values = [getattr(r, attr) for r in results]
        cells = [fmt.format(v) for v in (statistics.median(values), min(values), max(values))]
        print(f"{label:36} {cells[0]:>10} {cells[1]:>10} {cells[2]:>10}")


LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_args() -> argparse.Namespace:
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
    parser.add_argument("--swarm", type=int, default=0, metavar="N",
                        help="run a wurk-swarm of N children (one slot) instead of one "
                             "`wurk run` (default 0: wurk run)")
    parser.add_argument("--log-level", default="warning", metavar="LEVEL[,LEVEL]",
                        help="the workers' log level; two comma-separated levels alternate "
                             "run by run and print the paired ratio (default warning)")
    parser.add_argument("--tree", type=Path, action="append", metavar="DIR",
                        help="a wurk source tree to run the workers from (repeat to compare "
                             "trees, e.g. a worktree of the branch point; default this one)")
    args = parser.parse_args()
    if args.jobs < 1 or args.runs < 1 or args.swarm < 0:
        parser.error("--jobs and --runs must be at least 1, --swarm at least 0")
    args.levels = args.log_level.split(",")
    if len(args.levels) > 2 or any(level not in LEVELS for level in args.levels):
        parser.error(f"--log-level takes one or two of {', '.join(LEVELS)}")
    args.trees = [tree.resolve() for tree in args.tree or [ROOT]]
    for tree in args.trees:
        if not (tree / "wurk" / "__init__.py").is_file():
            parser.error(f"--tree {tree}: no wurk package there")
    return args


def variants(args: argparse.Namespace) -> list[Variant]:
    fetches = [True, False] if args.fetch == "both" else [args.fetch == "reliable"]
    out = []
    for tree, level, reliable in product(args.trees, args.levels, fetches):
        labels = ((tree.name,) if len(args.trees) > 1 else ()) + \
            ((level,) if len(args.levels) > 1 else ()) + \
            (("reliable" if reliable else "basic",) if len(fetches) > 1 else ())
        out.append(Variant(reliable, level, tree, args.swarm, labels))
    return out


def paired(results: dict[Variant, list[Result]], top: Variant, bottom: Variant,
           what: str) -> None:
    for label, attr in (("process", "process_per_s"), ("steady", "steady_per_s")):
        ratios = [getattr(a, attr) / getattr(b, attr)
                  for a, b in zip(results[top], results[bottom], strict=True)]
        print(f"{what} {label} jobs/s, median of paired runs: "
              f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, "
              f"max {max(ratios):.2f})")


def ratios(args: argparse.Namespace, results: dict[Variant, list[Result]]) -> None:
    for variant in results:
        prefix = f"{variant.tree.name}: " if len(args.trees) > 1 else ""
        if args.fetch == "both" and variant.reliable:
            basic = next(v for v in results if v.tree == variant.tree
                         and v.level == variant.level and not v.reliable)
            paired(results, variant, basic,
                   f"{prefix}reliable/basic" + (f" at {variant.level}"
                                                if len(args.levels) > 1 else ""))
        if len(args.levels) == 2 and variant.level == args.levels[0]:
            other = next(v for v in results if v.tree == variant.tree
                         and v.reliable == variant.reliable and v.level == args.levels[1])
            paired(results, variant, other, f"{prefix}{args.levels[0]}/{args.levels[1]}")


def main() -> int:
    args = parse_args()
    kinds = variants(args)
    results: dict[Variant, list[Result]] = {kind: [] for kind in kinds}
    with redis_server() as server:
        for tree in args.trees:
            check_tree(tree, server.url)
        for n in range(1, args.runs + 1):
            # Alternate the order (ABBA), so drift in the machine's load is shared.
            for kind in kinds if n % 2 else kinds[::-1]:
                result = one_run(server, args.jobs, args.concurrency, args.timeout, kind)
                print(f"run {n} ({kind.name}): enqueue {result.enqueue_per_s:,.0f}/s, "
                      f"process {result.process_per_s:,.0f}/s, "
                      f"steady {result.steady_per_s:,.0f}/s, "
                      f"peak RSS {result.peak_rss_mb:.1f} MB, "
                      f"{result.log_lines:,} log lines", flush=True)
                results[kind].append(result)
    for kind in kinds:
        report(results[kind], args.jobs, args.concurrency, kind)
    ratios(args, results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({kind.name: [asdict(r) for r in rs]
                                         for kind, rs in results.items()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

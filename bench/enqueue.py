"""Enqueue rate: wurk's client against Sidekiq 6.4.1's, in bulk and one job at a time.

    python bench/enqueue.py [--jobs 100000] [--single-jobs 20000] [--threads 10]
                            [--rounds 3] [--tree DIR ...] [--no-ruby]

Each round, against one private redis-server (free loopback port, no
persistence) that this script starts and stops itself, every client runs
each of two measurements in a fresh process, the order reversed on every
other round:

1. ``bulk``: N jobs (``args [i]``) through ``Client.push_bulk`` (Ruby:
   ``Sidekiq::Client.push_bulk``), 1 000 per call, from one thread.
2. ``single``: M jobs through the job's ``perform_async(i)`` from T threads
   (each pushes every T-th job), one pool of T connections per process.

The measuring process sets up (imports, dial, PING), says ``ready``, and
starts on ``go``: the parent reads Redis ``INFO stats`` and ``INFO
commandstats`` just before ``go`` and just after the result, so the deltas
count that measurement's work only. Reported per job: **reads**
(``total_reads_processed``: a reply-awaiting round trip is at least one;
a 1 000-job pipeline of ~200 kB is read in about a dozen 16 kB reads) and
**commands** (with the commands by name). Medians over the rounds, with the
range. ``--tree DIR`` runs wurk's measurements once per source tree (e.g. an
export of main: ``git archive main | tar -x -C /tmp/main``), for a before
and after in one sitting. Ruby's are skipped with a note when ``ruby`` or the
``sidekiq`` gem is missing; redis-rb's hiredis driver is used when it loads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BULK = 1000
RUBY_ENQUEUER = ROOT / "bench" / "peers" / "sidekiq_enqueue.rb"
# Runs this file with wurk from PYTHONPATH (a tree first): a venv's editable
# install puts a finder on sys.meta_path that would win over PYTHONPATH.
# With -c, sys.path starts with the working directory: dropped too.
BOOT = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
        "getattr(f, '__module__', '') + getattr(type(f), '__module__', '')]; "
        "path = sys.argv.pop(1); sys.argv[0] = path; runpy.run_path(path, run_name='__main__')")


# -- the measuring process (wurk) -------------------------------------------
def handshake() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def measure_bulk(jobs: int) -> float:
    import wurk  # noqa: PLC0415 - the child imports the tree it was given

    client = wurk.Client(wurk.Config(), drain_spool=False)
    client.pool.call("PING")
    slices = [[[i] for i in range(start, min(start + BULK, jobs))]
              for start in range(0, jobs, BULK)]
    handshake()
    started = time.perf_counter()
    for args in slices:
        client.push_bulk({"class": "NoopJob", "args": args})
    return time.perf_counter() - started


def measure_single(jobs: int, threads: int) -> float:
    import wurk  # noqa: PLC0415
    from bench.jobs import NoopJob  # noqa: PLC0415 - PYTHONPATH: the tree, then this one

    wurk.configure(wurk.Config(redis_pool_size=threads))
    wurk.Client.default().pool.call("PING")  # build the default client, dial once
    barrier = threading.Barrier(threads + 1)

    def pusher(first: int) -> None:
        barrier.wait()
        for i in range(first, jobs, threads):
            NoopJob.perform_async(i)

    workers = [threading.Thread(target=pusher, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    handshake()
    started = time.perf_counter()
    barrier.wait()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def child(args: argparse.Namespace) -> None:
    seconds = (measure_bulk(args.jobs) if args.child == "bulk"
               else measure_single(args.jobs, args.threads))
    print(json.dumps({"seconds": seconds, "wurk": sys.modules["wurk"].__file__}), flush=True)
    sys.stdin.readline()  # stay connected until the parent has read INFO


# -- the parent ----------------------------------------------------------------
def info(r: Any) -> dict[str, int]:
    stats = r.info("stats")
    counts = {"reads": int(stats["total_reads_processed"]),
              "commands": int(stats["total_commands_processed"])}
    for name, value in r.info("commandstats").items():
        counts[name.removeprefix("cmdstat_")] = int(value["calls"])
    return counts


def run_one(command: list[str], env: dict[str, str], r: Any, jobs: int,
            tree: Path | None) -> dict[str, float]:
    """One measurement in its own process; its figures per job, and jobs/s."""
    r.flushall()
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{command[:4]} did not start")
        before = info(r)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        after = info(r)
        proc.stdin.write("done\n")
        proc.stdin.flush()
    finally:
        proc.wait(60)
    result = json.loads(line)
    if tree is not None and not str(result["wurk"]).startswith(f"{tree}{os.sep}"):
        raise RuntimeError(f"measured {result['wurk']}, not the tree {tree}")
    seconds = float(result["seconds"])
    # The two INFO calls count themselves: one read and up to three commands.
    figures = {"jobs/s": jobs / seconds, "reads": (after["reads"] - before["reads"] - 2) / jobs}
    for name in after.keys() - {"reads", "info"}:
        delta = after[name] - before.get(name, 0) - (2 if name == "commands" else 0)
        if delta:
            figures[name] = delta / jobs
    if r.llen("queue:default") != jobs:
        raise RuntimeError(f"{command[:4]}: {r.llen('queue:default')} jobs queued, not {jobs}")
    return figures


def ruby_ready() -> str | None:
    """Why Ruby Sidekiq cannot run here, or None; sets the driver it will use."""
    if shutil.which("ruby") is None:
        return "ruby is not installed"
    check = subprocess.run(["ruby", "-e", 'require "sidekiq"; print Sidekiq::VERSION'],
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        return "the sidekiq gem does not load"
    return None


@dataclass(frozen=True)
class Measured:
    """One client: its label, its two commands, their environment, its wurk tree."""

    label: str
    bulk: list[str]
    single: list[str]
    env: dict[str, str]
    tree: Path | None = None


def clients(args: argparse.Namespace, url: str) -> list[Measured]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    base["REDIS_URL"] = url
    found: list[Measured] = []
    for tree in [t.resolve() for t in args.tree or [ROOT]]:
        env = {**base, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tree), str(ROOT), os.environ.get("PYTHONPATH")]))}
        head = [sys.executable, "-c", BOOT, str(Path(__file__).resolve()), "--child"]
        found.append(Measured("wurk" if not args.tree else f"wurk {tree}",
                              [*head, "bulk", "--jobs", str(args.jobs)],
                              [*head, "single", "--jobs", str(args.single_jobs),
                               "--threads", str(args.threads)], env, tree))
    missing = None if args.no_ruby else ruby_ready()
    if args.no_ruby or missing:
        print(f"Sidekiq skipped: {missing or '--no-ruby'}")
        return found
    hiredis = subprocess.run(["ruby", "-e", 'require "hiredis"'], capture_output=True,
                             check=False).returncode == 0
    env = {**base, "BENCH_SIDEKIQ_POOL": str(args.threads)}
    if hiredis:
        env["BENCH_SIDEKIQ_DRIVER"] = "hiredis"
    ruby = ["ruby", str(RUBY_ENQUEUER)]
    found.append(Measured(f"sidekiq ({'hiredis' if hiredis else 'ruby driver'})",
                          [*ruby, "bulk-go", str(args.jobs)],
                          [*ruby, "threads", str(args.single_jobs), str(args.threads)], env))
    return found


def report(results: dict[tuple[str, str], list[dict[str, float]]]) -> None:
    for (label, kind), runs in results.items():
        rates = [run["jobs/s"] for run in runs]
        names = sorted({name for run in runs for name in run} - {"jobs/s"})
        per_job = ", ".join(f"{name} {statistics.median(run.get(name, 0) for run in runs):.3f}"
                            for name in names)
        print(f"{label:38} {kind:6} {statistics.median(rates):9,.0f} jobs/s "
              f"({min(rates):,.0f}-{max(rates):,.0f})  per job: {per_job}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="push_bulk jobs (100000)")
    parser.add_argument("--single-jobs", type=int, default=20_000,
                        help="perform_async jobs (20000)")
    parser.add_argument("--threads", type=int, default=10, help="perform_async threads (10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--tree", type=Path, action="append", metavar="DIR",
                        help="a wurk source tree to measure (repeatable; default this one)")
    parser.add_argument("--no-ruby", action="store_true", help="skip Ruby Sidekiq")
    parser.add_argument("--child", choices=("bulk", "single"), help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.child:
        child(args)
        return 0
    sys.path.insert(0, str(ROOT))
    from bench.noop_throughput import redis_server  # noqa: PLC0415

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with redis_server() as server:
        r = server.client()
        measured = clients(args, server.url)
        for round_no in range(args.rounds):
            order = measured if round_no % 2 == 0 else measured[::-1]
            for one in order:
                results.setdefault((one.label, "bulk"), []).append(
                    run_one(one.bulk, one.env, r, args.jobs, one.tree))
                results.setdefault((one.label, "single"), []).append(
                    run_one(one.single, one.env, r, args.single_jobs, one.tree))
            print(f"round {round_no + 1}/{args.rounds} done", flush=True)
    print(f"\nbulk: {args.jobs} jobs, {BULK} per push_bulk; single: {args.single_jobs} "
          f"jobs, perform_async from {args.threads} threads; medians of {args.rounds} rounds")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

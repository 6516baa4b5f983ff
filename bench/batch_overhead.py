"""What a batch costs per job: plain jobs vs batch jobs, pushed and run, paired in one run.

    python bench/batch_overhead.py [--jobs 5000] [--rounds 5] [--concurrency 5]

Starts a private redis-server (loopback, free port, no persistence). Each
round, alternating which goes first, it

* pushes ``--jobs`` jobs one ``push`` at a time, plain and as ``Batch.add``;
* pushes them with ``push_bulk`` (a thousand per call), plain and as
  ``Batch.add_bulk``;
* runs them (a no-op job) in an in-process worker of ``--concurrency``
  threads, from the first fetch to the last job done (the batch's success
  callback pushed), plain and as one batch.

For each it prints microseconds per job, Redis round trips per job as the
server counts socket reads (``total_reads_processed``; a pipeline or a
script is one), scripts (EVALSHA) per job and the server's time per
script (``cmdstat_evalsha``). Medians over the rounds and
the median of the paired per-round differences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import wurk  # noqa: E402
from bench.noop_throughput import redis_server  # noqa: E402
from wurk.runtime.launcher import Launcher  # noqa: E402

# µs, round trips and scripts per job; µs in Redis per script
Figures = tuple[float, float, float, float]
_done = threading.Semaphore(0)


@wurk.job(name="bench_batch_noop")
def noop(i: int) -> None:
    _done.release()


@wurk.job(name="bench_batch_callback")
def callback(status: dict[str, object]) -> None:
    _done.release()


def counters(r: redis.Redis) -> tuple[int, int, int]:
    info = r.info("all")
    evalsha = info.get("cmdstat_evalsha", {})
    return (int(info["total_reads_processed"]), int(evalsha.get("calls", 0)),
            int(evalsha.get("usec", 0)))


def measure(r: redis.Redis, jobs: int, work: Callable[[], object]) -> Figures:
    before = counters(r)
    started = time.perf_counter()
    work()
    elapsed = time.perf_counter() - started
    after = counters(r)
    scripts = after[1] - before[1]
    return (elapsed / jobs * 1e6, (after[0] - before[0] - 1) / jobs, scripts / jobs,
            (after[2] - before[2]) / scripts if scripts else 0.0)


def pushes(client: wurk.Client, jobs: int) -> dict[str, Callable[[], object]]:
    def plain() -> None:
        for i in range(jobs):
            noop.perform_async(i)

    def batch() -> None:
        with wurk.Batch(client=client) as b:
            for i in range(jobs):
                b.add(noop, i)

    def bulk_plain() -> None:
        noop.perform_bulk([i] for i in range(jobs))

    def bulk_batch() -> None:
        with wurk.Batch(client=client) as b:
            b.add_bulk(noop, ([i] for i in range(jobs)))

    return {"push plain": plain, "push batch": batch, "bulk plain": bulk_plain,
            "bulk batch": bulk_batch}


def run(config: wurk.Config, r: redis.Redis, jobs: int, batched: bool) -> Figures:
    """Push ``jobs`` (not timed), then time a worker running them all."""
    if batched:
        with wurk.Batch(on_success=callback) as b:
            b.add_bulk(noop, ([i] for i in range(jobs)))
    else:
        noop.perform_bulk([i] for i in range(jobs))
    waited = jobs + (1 if batched else 0)
    launcher = Launcher(config)

    def work() -> None:
        launcher.start()
        for _ in range(waited):
            _done.acquire()

    try:
        return measure(r, jobs, work)
    finally:
        launcher.stop(time.monotonic() + 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=5)
    opts = parser.parse_args()
    with redis_server() as server, redis.Redis.from_url(server.url) as r:
        config = wurk.Config(redis_url=server.url, log_level="warning", reliable_push=False,
                             concurrency=opts.concurrency, fetch_timeout=0.2,
                             heartbeat_interval=1.0)
        wurk.configure(config)
        client = wurk.Client.default()
        ways = pushes(client, opts.jobs)
        names = [*ways, "run plain", "run batch"]
        rows: dict[str, list[Figures]] = {name: [] for name in names}
        for n in range(1, opts.rounds + 1):
            for name in names if n % 2 else names[::-1]:
                r.flushall()
                if name.startswith("run"):
                    rows[name].append(run(config, r, opts.jobs, name == "run batch"))
                else:
                    rows[name].append(measure(r, opts.jobs, ways[name]))
            print(f"round {n}: " + "  ".join(f"{k} {v[-1][0]:.1f} µs" for k, v in rows.items()))
        print(f"\nmedians over {opts.rounds} rounds of {opts.jobs} jobs:")
        for name, got in rows.items():
            print(f"  {name:11} {statistics.median(g[0] for g in got):8.2f} µs/job  "
                  f"{statistics.median(g[1] for g in got):6.3f} round trips/job  "
                  f"{statistics.median(g[2] for g in got):6.3f} scripts/job  "
                  f"{statistics.median(g[3] for g in got):6.1f} µs in Redis/script")
        print("\nbatch overhead per job (median of the paired differences):")
        for kind in ("push", "bulk", "run"):
            plain, batch = rows[f"{kind} plain"], rows[f"{kind} batch"]
            print(f"  {kind:5} +{statistics.median(b[0] - p[0] for b, p in zip(batch, plain, strict=True)):7.2f} µs  "  # noqa: E501
                  f"+{statistics.median(b[1] - p[1] for b, p in zip(batch, plain, strict=True)):6.3f} round trips")  # noqa: E501


if __name__ == "__main__":
    main()

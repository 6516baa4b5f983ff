"""What a workflow costs: per step of a chain, and for a chord of a thousand jobs.

    python bench/workflow_overhead.py [--steps 50] [--chord 1000] [--rounds 3]

Starts a private redis-server (loopback, free port, no persistence) and an
in-process worker. Each round it runs a chain of ``--steps`` one-job steps
(each step passing its result on) from ``start()`` to the final state, and a
chord: a group of ``--chord`` jobs then one step that gets all their
results. It prints wall time and Redis round trips (``total_reads_processed``)
per step of the chain, and per job of the chord (the bench's own polling
taken out; the worker's idle fetches are in); medians over the rounds.
A chain step is a batch, its job, and one advance job: the round trips
are what that costs beyond running the job itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import wurk  # noqa: E402
from bench.noop_throughput import redis_server  # noqa: E402
from wurk.runtime.launcher import Launcher  # noqa: E402


@wurk.job(name="bench_wf_first")
def first() -> int:
    return 1


@wurk.job(name="bench_wf_next")
def add_one(got: int) -> int:
    return got + 1


@wurk.job(name="bench_wf_square")
def square(n: int) -> int:
    return n * n


@wurk.job(name="bench_wf_total")
def total(got: list[int]) -> int:
    return sum(got)


def reads(r: redis.Redis) -> int:
    return int(r.info("stats")["total_reads_processed"])


def timed(r: redis.Redis, flow: object) -> tuple[float, int]:
    before, started = reads(r), time.perf_counter()
    wid = wurk.Workflow(flow).start()
    polls = 0
    while r.hget(f"wurk:wf:{wid}", "finished_at") is None:
        polls += 1
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    state = r.hget(f"wurk:wf:{wid}", "state")
    if state != b"succeeded":
        raise SystemExit(f"workflow {wid} ended {state!r}")
    # Less this loop's own reads (its polls, the last HGETs, the INFO).
    return elapsed, reads(r) - before - polls - 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--chord", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    with redis_server() as server, redis.Redis.from_url(server.url) as r:
        config = wurk.Config(redis_url=server.url, log_level="warning", reliable_push=False,
                             fetch_timeout=0.2, heartbeat_interval=1.0)
        wurk.configure(config)
        launcher = Launcher(config)
        launcher.start()
        chains, chords = [], []
        try:
            for n in range(1, opts.rounds + 1):
                r.flushall()
                flow = wurk.step(first)
                for _ in range(opts.steps - 1):
                    flow = flow >> wurk.step(add_one, results=True)
                chains.append(timed(r, flow))
                r.flushall()
                chords.append(timed(r, wurk.group(square, [[i] for i in range(opts.chord)])
                                    >> wurk.step(total, results=True)))
                print(f"round {n}: chain {chains[-1][0]:.3f} s, chord {chords[-1][0]:.3f} s")
        finally:
            launcher.stop(time.monotonic() + 2)
        print(f"\nmedians over {opts.rounds} rounds:")
        print(f"  chain of {opts.steps}: "
              f"{statistics.median(c[0] for c in chains) / opts.steps * 1000:.2f} ms/step, "
              f"{statistics.median(c[1] for c in chains) / opts.steps:.1f} round trips/step")
        print(f"  chord of {opts.chord} + 1: {statistics.median(c[0] for c in chords):.3f} s, "
              f"{statistics.median(c[1] for c in chords) / opts.chord:.1f} round trips/job")


if __name__ == "__main__":
    main()

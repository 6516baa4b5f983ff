"""What unique jobs cost a push: unique off vs on, paired in one run.

    python bench/unique_push.py [--pushes 5000] [--rounds 5] [--bulk 1000]

Starts a private redis-server (loopback, free port, no persistence) and, round
by round, alternating which goes first, pushes N single jobs from one thread
in each of these ways:

* ``plain``: no unique_for (the path every ordinary push takes);
* ``unique``: unique_for=60 with distinct arguments (each push takes a lock);
* ``duplicate``: unique_for=60 with the same arguments (each push is refused);

and ``push_bulk`` calls of ``--bulk`` jobs each (N jobs in all), plain and
unique. For each it prints
microseconds per push, Redis round trips per push as the socket reads Redis
counted (``total_reads_processed``, the INFO call itself taken out: a
pipeline or a script counts once, though Redis reads a request larger than
16 KiB, a bulk batch, in several reads) and lock scripts (EVALSHA) per push.
Also the price an ordinary push pays for the built-in step it does not use,
timed alone.
Medians over the rounds, and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

import wurk  # noqa: E402
from bench.noop_throughput import redis_server  # noqa: E402
from wurk.push import steps  # noqa: E402

Push = Callable[[int], object]


def reads(r: redis.Redis) -> tuple[int, int]:
    """(socket reads so far, EVALSHA calls so far), in one INFO."""
    info = r.info("all")
    return (int(info["total_reads_processed"]),
            int(info.get("cmdstat_evalsha", {}).get("calls", 0)))


def measure(r: redis.Redis, count: int, push: Push) -> tuple[float, float, float]:
    """(µs, socket reads, EVALSHA calls) per call of ``push``, over ``count`` calls."""
    before = reads(r)
    started = time.perf_counter()
    for i in range(count):
        push(i)
    elapsed = time.perf_counter() - started
    after = reads(r)
    trips = after[0] - before[0] - 1  # the second INFO is counted when it is read
    return elapsed / count * 1e6, trips / count, (after[1] - before[1]) / count


def ways(client: wurk.Client, bulk: int) -> dict[str, tuple[int, Push]]:
    """name -> (how many jobs one call pushes, the call)."""
    tag = [0]

    def fresh(i: int) -> int:
        tag[0] += 1
        return tag[0]

    return {
        "plain": (1, lambda i: client.push({"class": "Noop", "args": [fresh(i)]})),
        "unique": (1, lambda i: client.push({"class": "Noop", "args": [fresh(i)],
                                             "unique_for": 60})),
        "duplicate": (1, lambda i: client.push({"class": "Noop", "args": ["same"],
                                                "unique_for": 60})),
        "bulk plain": (bulk, lambda i: client.push_bulk(
            {"class": "Noop", "args": [[fresh(i)] for _ in range(bulk)]})),
        "bulk unique": (bulk, lambda i: client.push_bulk(
            {"class": "Noop", "args": [[fresh(i), n] for n in range(bulk)],
             "unique_for": 60})),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bulk", type=int, default=1000)
    opts = parser.parse_args()
    with redis_server() as server, redis.Redis.from_url(server.url) as r:
        client = wurk.Client(wurk.Config(redis_url=server.url, log_level="warning"),
                             buffered=False, drain_spool=False)
        calls = ways(client, opts.bulk)
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in calls}
        for n in range(1, opts.rounds + 1):
            order = list(calls) if n % 2 else list(reversed(calls))
            for name in order:
                per_call, push = calls[name]
                times = max(1, opts.pushes // per_call)
                us, trips, scripts = measure(r, times, push)
                rows[name].append((us / per_call, trips / per_call, scripts / per_call))
            r.flushall()
            print(f"round {n}: " + "  ".join(
                f"{name} {rows[name][-1][0]:.1f} µs" for name in calls))
        print("\nmedians:")
        for name, got in rows.items():
            print(f"  {name:12} {statistics.median(g[0] for g in got):8.2f} µs/push  "
                  f"{statistics.median(g[1] for g in got):6.3f} reads/push  "
                  f"{statistics.median(g[2] for g in got):6.3f} lock scripts/push")
        ratio = statistics.median(u[0] / p[0] for u, p in zip(
            rows["unique"], rows["plain"], strict=True))
        print(f"paired ratio unique/plain (time): {ratio:.2f}")
        payload = {"class": "Noop", "args": [1], "queue": "default", "jid": "x" * 24}
        number = 200_000
        job = (payload, None)
        # The steps' flow over a push none of them has work for: it asks nothing.
        check = timeit.timeit(lambda: next(steps.admit([job]), None), number=number)
        # What a plain push did before there were built-ins: nothing; a list of one
        # is the floor any per-push step pays.
        floor = timeit.timeit(lambda: ([job], lambda: None), number=number)
        print(f"the built-in step on a plain push (no round trip): "
              f"{check / number * 1e9:.0f} ns (building its arguments alone: "
              f"{floor / number * 1e9:.0f} ns)")

if __name__ == "__main__":
    main()

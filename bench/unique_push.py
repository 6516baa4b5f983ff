"""What unique jobs cost a push: unique off vs on, paired in one run.

    python bench/unique_push.py [--pushes 5000] [--rounds 5] [--bulk 1000]

Starts a private redis-server (loopback, free port, no persistence) and, round
by round, alternating which goes first, pushes N single jobs from one thread
in each of these ways:

* ``plain``: no unique_for (the path every ordinary push takes);
* ``unique``: unique_for=60 with distinct arguments (each push takes a lock);
* ``duplicate``: unique_for=60 with the same arguments (each push is refused);

and one ``push_bulk`` of ``--bulk`` jobs plain and unique. For each it prints
microseconds per push and Redis round trips per push: socket reads Redis
counted (``INFO stats`` ``total_reads_processed``, the INFO call itself taken
out), so a pipeline or a script counts once. Also the price of the check an
ordinary push pays for the built-in middleware it does not use, timed alone.
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
from wurk.push import middleware  # noqa: E402

Push = Callable[[int], object]


def reads(r: redis.Redis) -> int:
    return int(r.info("stats")["total_reads_processed"])


def measure(r: redis.Redis, count: int, push: Push) -> tuple[float, float]:
    """(µs per push, round trips per push) over ``count`` pushes."""
    before = reads(r)
    started = time.perf_counter()
    for i in range(count):
        push(i)
    elapsed = time.perf_counter() - started
    trips = reads(r) - before - 1  # the second INFO is counted when it is read
    return elapsed / count * 1e6, trips / count


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
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
        for n in range(1, opts.rounds + 1):
            order = list(calls) if n % 2 else list(reversed(calls))
            for name in order:
                per_call, push = calls[name]
                times = max(1, opts.pushes // per_call)
                us, trips = measure(r, times, push)
                rows[name].append((us / per_call, trips / per_call))
            r.flushall()
            print(f"round {n}: " + "  ".join(
                f"{name} {rows[name][-1][0]:.1f} µs" for name in calls))
        print("\nmedians:")
        for name, got in rows.items():
            print(f"  {name:12} {statistics.median(u for u, _ in got):8.2f} µs/push  "
                  f"{statistics.median(t for _, t in got):6.3f} round trips/push")
        ratio = statistics.median(u / p for (u, _), (p, _) in zip(
            rows["unique"], rows["plain"], strict=True))
        print(f"paired ratio unique/plain (time): {ratio:.2f}")
        payload = {"class": "Noop", "args": [1], "queue": "default", "jid": "x" * 24}
        number = 500_000
        check = timeit.timeit(lambda: middleware.wanted((), payload), number=number)
        # What the client checked before there were built-ins: is the chain empty?
        before = timeit.timeit(lambda: not (), number=number)
        print(f"the check a plain push makes for the unused built-in: "
              f"{check / number * 1e9:.0f} ns (an empty-chain test alone: "
              f"{before / number * 1e9:.0f} ns)")


if __name__ == "__main__":
    main()

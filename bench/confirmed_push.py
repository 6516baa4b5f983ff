"""What confirmed pushes cost: plain vs ``push_replicas = 1`` on one box.

    python bench/confirmed_push.py [--pushes 5000] [--rounds 5]

Starts a private primary and one replica (loopback, free ports, no
persistence), then alternates, round by round, between a plain client and a
confirming client, each pushing N single jobs from one thread (the shape of
a web request enqueueing one job). Prints pushes/s for each per round, the
median of each, and the median of the per-round ratios (plain/confirmed),
which is the figure to read on a noisy machine. Also checks that every push
reached the replica and that the markers of confirmed pushes were retired.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import wurk  # noqa: E402
from bench.noop_throughput import redis_server  # noqa: E402
from wurk.wire import keys  # noqa: E402

# Without this a fresh replica waits five seconds before its first sync.
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def until(check: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"gave up waiting: {what}")
        time.sleep(0.05)


def push_rate(client: wurk.Client, pushes: int, tag: str) -> float:
    started = time.perf_counter()
    for i in range(pushes):
        client.push({"class": "Noop", "args": [i], "queue": tag})
    return pushes / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()

    with ExitStack() as stack:
        primary = stack.enter_context(redis_server(*FAST_SYNC))
        port = str(urlsplit(primary.url).port)
        replica = stack.enter_context(redis_server(*FAST_SYNC, "--replicaof", "127.0.0.1", port))
        with primary.client() as p:
            p.set("bench:probe", 1)
            until(lambda: p.execute_command("WAIT", 1, 200) == 1, "replica in sync")
        url = primary.url
        plain = wurk.Client(wurk.Config(redis_url=url, log_level="warning"))
        confirmed = wurk.Client(wurk.Config(redis_url=url, push_replicas=1,
                                            log_level="warning"))
        rows: list[tuple[float, float]] = []
        for n in range(1, opts.rounds + 1):
            # Alternate which goes first, so drift in the machine's load is shared.
            if n % 2:
                a = push_rate(plain, opts.pushes, "plain")
                b = push_rate(confirmed, opts.pushes, "confirmed")
            else:
                b = push_rate(confirmed, opts.pushes, "confirmed")
                a = push_rate(plain, opts.pushes, "plain")
            rows.append((a, b))
            print(f"round {n}: plain {a:8.0f} pushes/s   confirmed {b:8.0f} pushes/s   "
                  f"ratio {a / b:.2f}")
        with replica.client() as r:
            expected = opts.pushes * opts.rounds
            counts = (r.llen("queue:plain"), r.llen("queue:confirmed"))
            leftover = sum(1 for _ in r.scan_iter(match=f"{keys.PUSHED_PREFIX}*"))
        print(f"\nmedian plain {statistics.median(a for a, _ in rows):.0f} pushes/s, "
              f"confirmed {statistics.median(b for _, b in rows):.0f} pushes/s, "
              f"paired ratio {statistics.median(a / b for a, b in rows):.2f}")
        print(f"on the replica: plain {counts[0]}/{expected}, confirmed {counts[1]}/{expected}; "
              f"markers left {leftover}")
        if counts != (expected, expected):
            sys.exit("some pushes are missing on the replica")


if __name__ == "__main__":
    main()

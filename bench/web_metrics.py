"""Metrics page times on a full window: many classes, every minute of 8 hours.

    .venv/bin/python bench/web_metrics.py [--classes 200] [--runs 5] [--layout sidekiq8]

Starts its own redis-server on a free port, writes 8 hours of metrics for
``--classes`` classes, each minute what a wurk heartbeat writes
(:func:`wurk.observe.class_metrics.flush_commands` in ``--layout``:
``sidekiq8``, wurk's default, with its 10-minute rollups, or ``sidekiq7``,
which is also what Ruby Sidekiq 7.x writes), starts a real ``wurk web``, and
times whole page loads of the Metrics page for 1 and 8 hours and of one
class's page for 1 and 8 hours (median and worst of ``--runs``, milliseconds).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import redis
from web_large import BIN, free_port, load

from wurk.observe.class_metrics import LAYOUTS, ClassCounts, flush_commands


def fill(r: redis.Redis, classes: int, layout: str) -> None:
    started = time.perf_counter()
    now = time.time()
    for back in range(8 * 60):
        taken = {}
        for n in range(classes):
            counts = ClassCounts(processed=10 + n % 7, failed=n % 3, ms=1000 + n)
            counts.histogram[n % 26] = 9
            taken[f"App::Jobs::Worker{n:04d}"] = counts
        pipe = r.pipeline(transaction=False)
        for command in flush_commands(taken, now - 60 * back, layout=layout):
            pipe.execute_command(*command)
        pipe.execute()
    print(f"filled {classes:,} classes x 480 minutes ({layout}) in "
          f"{time.perf_counter() - started:.1f} s; "
          f"Redis uses {r.info('memory')['used_memory_human']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--layout", choices=LAYOUTS, default="sidekiq8")
    args = parser.parse_args()
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="wurk-bench-metrics-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", workdir],
                              stdout=subprocess.DEVNULL)
    web = None
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        fill(r, args.classes, args.layout)
        web = subprocess.Popen([str(BIN / "wurk"), "web", "--port", "0", "--redis-url",
                                f"redis://127.0.0.1:{port}/0"], stdout=subprocess.PIPE, text=True)
        assert web.stdout is not None
        base = re.search(r"(http://\S+?)/?$", web.stdout.readline().strip()).group(1)  # type: ignore[union-attr]
        cases = [("Metrics, 1 hour", "/metrics?hours=1"), ("Metrics, 8 hours", "/metrics?hours=8"),
                 ("one class, 1 hour", "/metrics/App::Jobs::Worker0007?hours=1"),
                 ("one class, 8 hours", "/metrics/App::Jobs::Worker0007?hours=8")]
        print(f"\n{'page':30} {'median ms':>10} {'worst ms':>10} {'KB':>7}")
        for name, path in cases:
            times, size = [], 0
            for _ in range(args.runs):
                took, body = load(base + path)
                times.append(took)
                size = len(body)
            print(f"{name:30} {statistics.median(times):10.1f} {max(times):10.1f} "
                  f"{size / 1024:7.0f}")
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
            if web.stdout:
                web.stdout.close()
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Metrics page times on a full window: many classes, every minute of 8 hours.

    .venv/bin/python bench/web_metrics.py [--classes 200] [--runs 5]

Starts its own redis-server on a free port, writes 8 hours of per-minute
metrics for ``--classes`` classes in Sidekiq 7's format (a minute hash field
per class and counter, a histogram per class and minute: what that many
busy classes leave behind), starts a real ``wurk web``, and times whole page
loads of the Metrics page for 1 and 8 hours and of one class's page for 1
and 8 hours (median and worst of ``--runs``, milliseconds).
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
from datetime import UTC, datetime

import redis
from web_large import BIN, free_port, load

from wurk.observe.class_metrics import histogram_key, minute_key


def fill(r: redis.Redis, classes: int) -> None:
    started = time.perf_counter()
    now = time.time()
    for back in range(8 * 60):
        at = datetime.fromtimestamp(now - 60 * back, UTC)
        pipe = r.pipeline(transaction=False)
        minute = minute_key(at)
        for n in range(classes):
            cls = f"App::Jobs::Worker{n:04d}"
            pipe.hincrby(minute, f"{cls}|p", 10 + n % 7)
            pipe.hincrby(minute, f"{cls}|f", n % 3)
            pipe.hincrby(minute, f"{cls}|ms", 1000 + n)
            pipe.execute_command("BITFIELD", histogram_key(cls, at), "OVERFLOW", "SAT",
                                 "INCRBY", "u16", f"#{n % 26}", 9)
        pipe.execute()
    print(f"filled {classes:,} classes x 480 minutes in {time.perf_counter() - started:.1f} s; "
          f"Redis uses {r.info('memory')['used_memory_human']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
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
        fill(r, args.classes)
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

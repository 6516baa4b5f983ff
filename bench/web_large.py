"""Dashboard page times on big data: a queue of 1,000,000 jobs, a morgue of 10,000.

    .venv/bin/python bench/web_large.py [--jobs 1000000] [--dead 10000] [--runs 5]

Starts its own redis-server on a free port (nothing else is touched), fills
``queue:big`` and ``dead`` with pipelined writes in batches, starts a real
``wurk web`` on a free port, and times whole HTTP page loads (request to
last byte, urllib, one connection per request) of: the Queues page, the
first and a deep page of the big queue, the Dead page, a Dead search for one
jid (ZSCAN over all 10,000), a search matching every entry (stops at the
1,000-match limit), one dead job's page, and the Dashboard. Prints the
median and the worst of ``--runs`` loads each, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import redis

BIN = Path(sys.executable).parent
BATCH = 10_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def payload(n: int, klass: str, queue: str, extra: dict[str, object] | None = None) -> str:
    item = {"class": klass, "args": [n, f"user-{n}@example.com", {"plan": "pro"}],
            "queue": queue, "jid": f"{n:024x}", "retry": True,
            "created_at": 1.7e9 + n, "enqueued_at": 1.7e9 + n, **(extra or {})}
    return json.dumps(item)


def fill(r: redis.Redis, jobs: int, dead: int) -> None:
    started = time.perf_counter()
    r.sadd("queues", "big")
    for low in range(0, jobs, BATCH):
        r.lpush("queue:big", *[payload(n, "SendNewsletter", "big")
                               for n in range(low, min(jobs, low + BATCH))])
    failure = {"error_class": "RuntimeError", "error_message": "card declined",
               "failed_at": 1.7e9, "retry_count": 25}
    for low in range(0, dead, BATCH):
        r.zadd("dead", {payload(n, "ChargeCard", "critical", failure): 1.7e9 + n
                        for n in range(low, min(dead, low + BATCH))})
    print(f"filled {jobs:,} queued and {dead:,} dead in {time.perf_counter() - started:.1f} s; "
          f"Redis uses {r.info('memory')['used_memory_human']}")


def load(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as reply:
        body = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{url}: {reply.status}")
    return (time.perf_counter() - started) * 1000, body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="wurk-bench-web-")
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
        fill(r, args.jobs, args.dead)
        web = subprocess.Popen([str(BIN / "wurk"), "web", "--port", "0", "--redis-url",
                                f"redis://127.0.0.1:{port}/0"], stdout=subprocess.PIPE, text=True)
        assert web.stdout is not None
        base = re.search(r"(http://\S+?)/?$", web.stdout.readline().strip()).group(1)  # type: ignore[union-attr]
        middle = max(1, args.jobs // 25 // 2)
        one_jid = f"{args.dead // 2:024x}"
        _, dead_page = load(f"{base}/dead")
        key = re.search(r'name="key" value="([^"]+)"', dead_page.decode()).group(1)  # type: ignore[union-attr]
        cases = [
            ("Queues page", "/queues"),
            ("queue 'big', page 1", "/queues/big"),
            (f"queue 'big', page {middle:,} (job {middle * 25:,})", f"/queues/big?page={middle}"),
            ("Dead, page 1", "/dead"),
            ("Dead, search one jid", f"/dead?q={one_jid}"),
            ("Dead, search matching all (limit 1,000)", "/dead?q=ChargeCard"),
            ("one dead job", f"/dead/{quote(key, safe='')}"),
            ("Dashboard", "/"),
        ]
        print(f"\n{'page':48} {'median ms':>10} {'worst ms':>10} {'KB':>7}")
        for name, path in cases:
            times, size = [], 0
            for _ in range(args.runs):
                took, body = load(base + path)
                times.append(took)
                size = len(body)
            print(f"{name:48} {statistics.median(times):10.1f} {max(times):10.1f} "
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

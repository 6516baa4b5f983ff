"""Memory shared by a swarm's children, with and without ``gc.freeze()``.

    python bench/memory.py [--children 2] [--runs 3]

Each run starts its own redis-server and a ``wurk-swarm`` of N children that
preloads an application of realistic size (``bench/memory_app.py``: a few
standard-library packages plus a generated module of several hundred KB of
classes, functions and data). Once every child is ready it pushes jobs that
allocate and drop objects and then run one full ``gc.collect()``, as every
long-running process eventually does. Then it reads each child's USS (memory
only that process holds) and PSS (its fair share of shared pages) from
``/proc/<pid>/smaps`` through psutil, and prints the medians for
``gc_freeze = true`` and ``gc_freeze = false``, side by side, alternating the
two settings run by run so machine drift cancels.

Without the freeze, a child's first full collection writes to the header of
every object it inherited, so the kernel copies those pages into the child:
its USS grows by roughly the size of the preloaded heap.
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
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "bench" / ".memory_app_generated.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def generate_app_module(classes: int = 600) -> None:
    """A module of realistic bulk: classes with methods, constants, lookup tables."""
    lines = ['"""Generated bulk for the memory benchmark."""', "TABLE = {"]
    lines += [f"    'key{i}': ('value{i}', {i}, {i * 0.5}, [{i}, {i + 1}])," for i in range(4000)]
    lines.append("}")
    for i in range(classes):
        lines += [
            f"class Model{i}:",
            f"    '''Model number {i}.'''",
            f"    FIELDS = {tuple(f'f{j}' for j in range(8))!r}",
            "    def __init__(self, **kw):",
            "        self.data = dict(kw)",
            f"    def method_a{i}(self, x):",
            f"        return [x * k for k in range({i % 7 + 3})]",
            f"    def method_b{i}(self, y):",
            f"        return {{'id': {i}, 'y': y, 'name': 'Model{i}'}}",
            "",
        ]
    GENERATED.write_text("\n".join(lines) + "\n", encoding="utf-8")


TOPOLOGY = """
[wurk]
redis_url = "{url}"
require = ["bench.memory_app"]
log_level = "warning"
heartbeat_interval = 0.5
gc_freeze = {freeze}

[[slot]]
name = "app"
count = {children}
concurrency = 2
queues = ["default"]
"""


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with redis.Redis.from_url(url) as r:
                r.ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def one_run(freeze: bool, children: int, workdir: str) -> dict[str, float]:
    redis_proc, url = start_redis(workdir)
    topology = Path(workdir) / f"topology-{freeze}.toml"
    topology.write_text(TOPOLOGY.format(url=url, freeze=str(freeze).lower(),
                                        children=children), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
    swarm = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--topology",
                              str(topology)], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with redis.Redis.from_url(url) as r:
            wait_ready(r, children)
            push_jobs(r, children * 20)
            wait_for(lambda: int(r.get("bench:memory:done") or 0) >= children * 20, 60)
            time.sleep(1.0)  # let the children settle after their collections
        return measure(swarm.pid)
    finally:
        swarm.send_signal(signal.SIGTERM)
        try:
            swarm.wait(30)
        except subprocess.TimeoutExpired:
            swarm.kill()
        redis_proc.terminate()
        redis_proc.wait(10)


def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the swarm")
        time.sleep(0.1)


def wait_ready(r: redis.Redis, children: int) -> None:
    wait_for(lambda: len([m for m in r.smembers("processes") if r.hget(m, "info")])
             >= children, 60)


def push_jobs(r: redis.Redis, count: int) -> None:
    now = time.time()
    for i in range(count):
        job = {"class": "MemoryChurn", "args": [i], "queue": "default", "retry": False,
               "jid": f"{i:024x}", "created_at": now, "enqueued_at": now}
        r.lpush("queue:default", json.dumps(job))


def measure(parent_pid: int) -> dict[str, float]:
    children = psutil.Process(parent_pid).children()
    infos = [c.memory_full_info() for c in children]
    mb = 1024 * 1024
    return {
        "uss_mb": statistics.mean(i.uss for i in infos) / mb,
        "pss_mb": statistics.mean(i.pss for i in infos) / mb,
        "rss_mb": statistics.mean(i.rss for i in infos) / mb,
        "parent_rss_mb": psutil.Process(parent_pid).memory_info().rss / mb,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    generate_app_module()
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    workdir = tempfile.mkdtemp(prefix="wurk-memory-")
    try:
        for run in range(args.runs):
            for freeze in (True, False) if run % 2 == 0 else (False, True):
                results[freeze].append(one_run(freeze, args.children, workdir))
                print(f"run {run + 1} gc_freeze={freeze}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in results[freeze][-1].items()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(results)
    return 0


def report(results: dict[bool, list[dict[str, float]]]) -> None:
    def med(freeze: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[freeze])

    print("\n| per child (median) | gc_freeze = true | gc_freeze = false | ratio |")
    print("|---|---|---|---|")
    for key in ("uss_mb", "pss_mb", "rss_mb"):
        frozen, thawed = med(True, key), med(False, key)
        print(f"| {key} | {frozen:.1f} | {thawed:.1f} | {frozen / thawed:.0%} |")


if __name__ == "__main__":
    sys.exit(main())

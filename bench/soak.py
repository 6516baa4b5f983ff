"""Steady work for hours: does Redis memory and every process's memory go flat?

    python bench/soak.py [--minutes 120] [--rate 100] [--sample-seconds 60]

Starts a private ``redis-server`` (no persistence) and a real ``wurk-swarm``
with two slots: ``threads`` (one child, 10 threads, queue ``default``) and
``aio`` (one asyncio child, concurrency 50, queue ``aio``). Nothing is ever
killed. It pushes a steady mix at ``--rate`` jobs a second (bench/soak_jobs.py):
plain jobs on both executors, batches with ``success`` and ``complete``
callbacks, three-step workflows whose last step reads the group's results,
unique jobs, result-keeping jobs, jobs behind a concurrent and a bucket
limiter, and jobs that fail half their runs and retry after 2 s.

Every ``--sample-seconds`` it records Redis ``used_memory``, ``DBSIZE``, the
key count by family (``b-*-jids``, ``wurk:result:*``, ...), the size of
the ``batches`` and ``wurk:workflows`` indexes (and retry, schedule, dead) and each swarm
process's USS and RSS (psutil), prints one line, and at the end a table and a
verdict: the least-squares slope of each series over the second half of the
run, per hour, and whether it is flat. Flat means the fitted rise across the
second half is under 5 % of the series' mean there, or under an absolute
floor (1 MB for memory, 100 keys for counts), whichever is larger: the
floors keep a series that wobbles around a small value from being called
growing. ``--trace PREFIX`` has each child diff tracemalloc snapshots
(what grew since the second sample) into ``PREFIX-<pid>.txt``. Class
metrics keys (8 hours, Sidekiq's format) rise through any shorter run and
are shown as "bounded later". ``--json PATH`` writes every
sample.

Finished batches and workflows are kept ``batch_linger`` seconds (a day by
default); the soak sets it to ``--linger`` (600 s) so that their plateau
comes inside the run. At the default the plateau is the same shape, reached
after a day: about the rate of finished batches times a day times the bytes
one finished batch keeps (which the table's key counts and used_memory give).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import wurk  # noqa: E402
from bench import soak_jobs  # noqa: E402
from bench.memory import start_redis  # noqa: E402

TOPOLOGY = """
[wurk]
redis_url = "{url}"
require = ["bench.soak_jobs"]
log_level = "warning"
{linger_line}

[[slot]]
name = "threads"
count = 1
concurrency = 10
queues = ["default"]

[[slot]]
name = "aio"
count = 1
concurrency = 50
executor = "asyncio"
queues = ["aio"]
"""
MB = 1024 * 1024
TOLERANCE = 0.05
# Families whose bound is longer than a soak: rising in the run is their warm-up.
BOUNDED_LATER = {"h|*": "class metrics histograms, 8 h", "j|*": "class metrics, 8 h / 3 days"}
FLOORS = {"mb": 1.0, "keys": 100.0}

# Key families: the first matching pattern names a key's family.
FAMILIES = [
    (re.compile(r"^b-.+-(jids|failed|failinfo|died|kids|pkids|ukids|complete|success|death)$"),
     "b-*-{0}"),
    (re.compile(r"^b-.+$"), "b-*"),
    (re.compile(r"^wurk:wf:[^:]+:(\w+)$"), "wurk:wf:*:{0}"),
    (re.compile(r"^wurk:wf:[^:]+$"), "wurk:wf:*"),
    (re.compile(r"^(wurk:[\w-]+):.+"), "{0}:*"),
    (re.compile(r"^(lmtr[\w-]*):.+"), "{0}:*"),
    (re.compile(r"^(j|h)\|"), "{0}|*"),
    (re.compile(r"^(stat:\w+):.+"), "{0}:*"),
    (re.compile(r"^(queue):.+"), "{0}:*"),
    (re.compile(r".+(:work|:workers|-signals)$"), "<identity>{0}"),
    (re.compile(r"^[^:]+:\d+:[0-9a-f]+$"), "<identity>"),
    (re.compile(r"^[^:]+:\d+:swarm-[0-9a-f]+$"), "<swarm identity>"),
]


def family(key: str) -> str:
    for pattern, name in FAMILIES:
        m = pattern.match(key)
        if m:
            return name.format(*m.groups())
    return key


def key_counts(r: redis.Redis) -> dict[str, int]:
    counts: dict[str, int] = {}
    for raw in r.scan_iter(count=1000):
        name = family(raw.decode("utf-8", "replace"))
        counts[name] = counts.get(name, 0) + 1
    return counts


def processes(parent: psutil.Process) -> dict[str, tuple[float, float]]:
    """Label -> (USS MB, RSS MB) for the swarm parent and each child."""
    out: dict[str, tuple[float, float]] = {}
    for proc in [parent, *parent.children()]:
        try:
            title = " ".join(proc.cmdline())
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        m = re.search(r"child (\S+?)#(\d+)", title)
        label = f"{m.group(1)}#{m.group(2)}" if m else "parent"
        out[f"{label}@{proc.pid}"] = (info.uss / MB, info.rss / MB)
    return out


class Pusher:
    """Pushes the mix; one round is 20 jobs."""

    def __init__(self) -> None:
        self.wurk, self.j, self.n = wurk, soak_jobs, 0
        self.counts: dict[str, int] = {}

    def _count(self, kind: str, k: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + k

    def round(self) -> None:
        j, w = self.j, self.wurk
        self.n += 1
        n = self.n
        for i in range(3):
            j.soak_noop.perform_async(i)
            j.soak_aio_noop.perform_async(i)
        self._count("plain", 6)
        batch = w.Batch("soak", on_success=(j.soak_callback, ["success"]),
                        on_complete=(j.soak_callback, ["complete"]))
        with batch:
            batch.add(j.soak_noop, n)
            batch.add(j.soak_aio_noop, n)
            batch.add(j.soak_flaky, n)
        self._count("batch jobs", 3)
        w.Workflow({"a": {"job": "soak_noop", "args": [[n]]},
                    "b": {"job": "soak_value", "args": [[1], [2]], "after": ["a"]},
                    "c": {"job": "soak_merge", "args": [[]], "after": ["b"],
                          "results": True}}).start()
        self._count("workflow jobs", 4)
        j.soak_unique.perform_async(random.randrange(50))
        j.soak_aio_unique.perform_async(random.randrange(50))
        self._count("unique pushes", 2)
        j.soak_result.perform_async(n)
        j.soak_aio_result.perform_async(n)
        self._count("result", 2)
        j.soak_limited.perform_async(n)
        j.soak_limited.perform_async(n + 1)
        self._count("limited", 2)
        j.soak_aio_flaky.perform_async(n)
        self._count("flaky", 1)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (value per second) of (t, value) points."""
    if len(points) < 2:
        return 0.0
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


def verdict(samples: list[dict[str, Any]]) -> list[tuple[str, float, float, bool]]:
    """(series, mean over the second half, slope per hour, flat?) for every series."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return []
    span = half[-1]["t"] - half[0]["t"]
    series: dict[str, list[tuple[float, float]]] = {}
    for s in half:
        for name, value in s["series"].items():
            series.setdefault(name, []).append((s["t"], value))
    rows = []
    for name, points in sorted(series.items()):
        if len(points) < len(half):
            continue  # a process that did not live through the second half
        mean = sum(v for _, v in points) / len(points)
        per_s = slope(points)
        floor = FLOORS["mb"] if name.endswith("MB") else FLOORS["keys"]
        flat = abs(per_s * span) <= max(TOLERANCE * abs(mean), floor)
        rows.append((name, mean, per_s * 3600, flat or name.removeprefix("keys ")
                     in BOUNDED_LATER))
    return rows


def sample(r: redis.Redis, parent: psutil.Process, t0: float, top: int) -> dict[str, Any]:
    info = r.info("memory")
    series: dict[str, float] = {"redis used_memory MB": info["used_memory"] / MB,
                                "redis DBSIZE keys": float(r.dbsize())}
    for index in ("batches", "wurk:batches:retire", "wurk:workflows", "wurk:workflows:retire",
                  "retry", "schedule", "dead"):
        series[f"zcard {index} entries"] = float(r.zcard(index))
    counts = key_counts(r)
    for name, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        series[f"keys {name}"] = float(count)
    for label, (uss, rss) in processes(parent).items():
        series[f"{label} USS MB"] = uss
        series[f"{label} RSS MB"] = rss
    return {"t": time.time() - t0, "series": series}


def print_sample(s: dict[str, Any]) -> None:
    v = s["series"]
    procs = " ".join(f"{k.split(' ')[0]}={val:.1f}" for k, val in v.items() if k.endswith("USS MB"))
    print(f"[{s['t'] / 60:6.1f} min] used_memory {v['redis used_memory MB']:.1f} MB, "
          f"DBSIZE {v['redis DBSIZE keys']:.0f}, USS {procs}", flush=True)


def run(args: argparse.Namespace, workdir: str) -> list[dict[str, Any]]:
    redis_proc, url = start_redis(workdir)
    topology = Path(workdir) / "soak.toml"
    line = f"batch_linger = {args.linger}" if args.linger else ""
    topology.write_text(TOPOLOGY.format(url=url, linger_line=line), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WURK_REDIS_URL": url}
    os.environ["WURK_REDIS_URL"] = url
    if args.linger:
        os.environ["WURK_BATCH_LINGER"] = str(args.linger)  # the pusher's batches and workflows
    swarm = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--topology",
                              str(topology)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    samples: list[dict[str, Any]] = []
    try:
        r = redis.Redis.from_url(url)
        pusher, parent = Pusher(), psutil.Process(swarm.pid)
        t0 = time.time()
        end, next_sample = t0 + args.minutes * 60, t0 + args.sample_seconds
        rounds_per_s = args.rate / 20
        done = 0
        while time.time() < end:
            due = int((time.time() - t0) * rounds_per_s)
            while done < due:
                pusher.round()
                done += 1
            if swarm.poll() is not None:
                raise SystemExit(f"wurk-swarm exited with {swarm.returncode}")
            if time.time() >= next_sample:
                if args.trace:
                    soak_jobs.soak_trace.perform_async(str(args.trace))
                    soak_jobs.soak_aio_trace.perform_async(str(args.trace))
                samples.append(sample(r, parent, t0, args.top))
                print_sample(samples[-1])
                next_sample += args.sample_seconds
            time.sleep(0.01)
        print(f"pushed: {pusher.counts}; behind at the end: "
              f"{sum(r.llen(q) for q in (b'queue:default', b'queue:aio'))} queued, "
              f"{r.zcard('retry')} retrying, {r.zcard('dead')} dead", flush=True)
    finally:
        swarm.send_signal(signal.SIGTERM)
        try:
            swarm.wait(60)
        except subprocess.TimeoutExpired:
            swarm.kill()
        redis_proc.terminate()
        redis_proc.wait(10)
    return samples


def report(samples: list[dict[str, Any]]) -> bool:
    rows = verdict(samples)
    print("\n| series | first | last | mean (2nd half) | slope /h (2nd half) | flat |")
    print("|---|---|---|---|---|---|")
    first, last = samples[0]["series"], samples[-1]["series"]
    for name, mean, per_h, flat in rows:
        later = BOUNDED_LATER.get(name.removeprefix("keys "))
        shown = f"bounded later ({later})" if later else "yes" if flat else "NO"
        print(f"| {name} | {first.get(name, float('nan')):.1f} | {last[name]:.1f} | "
              f"{mean:.1f} | {per_h:+.2f} | {shown} |")
    growing = [name for name, _, _, flat in rows if not flat]
    print(f"\nverdict: {'FLAT' if not growing else 'GROWING: ' + ', '.join(growing)}"
          f" (flat = fitted rise over the second half within {TOLERANCE:.0%} of its mean"
          f" or {FLOORS['mb']:.0f} MB / {FLOORS['keys']:.0f} keys)")
    return not growing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--rate", type=float, default=100, help="jobs pushed a second")
    parser.add_argument("--sample-seconds", type=float, default=60)
    parser.add_argument("--top", type=int, default=100, help="key families sampled")
    parser.add_argument("--linger", type=int, default=600,
                        help="batch_linger: seconds finished batches and workflows are kept "
                             "(default 600, so the plateau comes inside the run; 0 = wurk's "
                             "default, a day)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--trace", type=Path, metavar="PREFIX",
                        help="tracemalloc in each child: at each sample, what grew since "
                             "the second sample, written to PREFIX-<pid>.txt (slows the "
                             "children; their USS then includes tracemalloc's own)"),
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    workdir = tempfile.mkdtemp(prefix="wurk-soak-")
    try:
        samples = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(samples), encoding="utf-8")
    if len(samples) < 2:
        print("too few samples for a verdict")
        return 1
    return 0 if report(samples) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Recovery after kills from outside: does a healthy job ever die, and how long does one kill cost?

    python bench/recovery.py                      # both scenarios, this work tree
    python bench/recovery.py --scenario kill      # only the single kill
    python bench/recovery.py --repo /path/to/other/checkout   # another wurk (before/after)

Run it with the project's venv; ``redis-server`` must be on PATH. It starts a
private redis-server (free loopback port, temp dir, no persistence) and a real
``wurk-swarm`` (reliable fetch) per scenario, and prints one line of figures
each:

1. ``storm``: one child (``--storm-concurrency`` threads, default 10) killed
   with SIGKILL from outside every ``--storm-every`` seconds (2.5) for
   ``--storm-seconds`` (60), with ``--storm-jobs`` (200) healthy jobs of
   ``--storm-job-seconds`` (2) each. Figures: jobs in the dead set (each a
   healthy job blamed for a kill it did not cause), jobs done, and seconds
   from the last kill until every job was done.
2. ``kill``: ``--kill-jobs`` (300) jobs of ``--kill-job-seconds`` (1) at
   ``--kill-concurrency`` (100), one SIGKILL once the child runs a full set.
   Figures: seconds from the kill until every job was done (about one job's
   time plus a child's boot when recovery runs side by side), dead count.

``--executor asyncio`` runs the same jobs as coroutines in an asyncio slot.
``--timeout`` (default 300 s) caps each wait; a scenario that runs out says
how far it got.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parent.parent

JOBS = textwrap.dedent("""
    import asyncio
    import os
    import time

    import redis

    import wurk

    _clients = {}


    def r():
        if os.getpid() not in _clients:
            _clients.clear()
            _clients[os.getpid()] = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        return _clients[os.getpid()]


    @wurk.job(name="bench_nap")
    def nap(tag, seconds):
        r().incr("bench:started")
        time.sleep(seconds)
        r().sadd("bench:done", tag)


    @wurk.job(name="bench_anap")
    async def anap(tag, seconds):
        r().incr("bench:started")
        await asyncio.sleep(seconds)
        r().sadd("bench:done", tag)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bench:
    def __init__(self, repo: Path, scratch: Path, timeout: float, executor: str) -> None:
        self.repo, self.scratch, self.timeout = repo, scratch, timeout
        self.executor = executor
        port = free_port()
        self.url = f"redis://127.0.0.1:{port}/0"
        self.server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(scratch)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis.from_url(self.url)
        self.wait(self._pings, 10)
        (scratch / "bench_recovery_jobs.py").write_text(JOBS, encoding="utf-8")

    def _pings(self) -> bool:
        try:
            return bool(self.r.ping())
        except redis.ConnectionError:
            return False

    def wait(self, predicate: object, timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return True
            time.sleep(0.05)
        return False

    def swarm(self, concurrency: int) -> subprocess.Popen[bytes]:
        self.r.flushall()
        topology = self.scratch / "topology.toml"
        topology.write_text(textwrap.dedent(f"""
            [wurk]
            redis_url = "{self.url}"
            require = ["bench_recovery_jobs"]
            reliable_fetch = true
            log_level = "warning"
            log_format = "json"
            shutdown_timeout = 5
            # A storm's kills come faster than the crash backoff would allow.
            respawn_backoff_max = 1.0

            [[slot]]
            name = "bench"
            concurrency = {concurrency}
            queues = ["bench"]
            executor = "{self.executor}"
        """), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
        env.update({"PYTHONPATH": os.pathsep.join([str(self.scratch), str(self.repo)]),
                    "BENCH_REDIS_URL": self.url})
        log = (self.scratch / "swarm.log").open("ab")
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--topology",
                                 str(topology)], stdout=log, stderr=log, env=env,
                                cwd=self.scratch, start_new_session=True)

    def push(self, count: int, seconds: float) -> None:
        now = time.time()
        cls = "bench_anap" if self.executor == "asyncio" else "bench_nap"
        pipe = self.r.pipeline()
        for n in range(count):
            pipe.lpush("queue:bench", json.dumps(
                {"class": cls, "args": [f"j{n}", seconds], "queue": "bench",
                 "jid": f"{n:024x}", "retry": False, "created_at": now, "enqueued_at": now}))
        pipe.sadd("queues", "bench")
        pipe.execute()

    def child(self, swarm: subprocess.Popen[bytes], not_pid: int = 0) -> int | None:
        try:
            kids = [c.pid for c in psutil.Process(swarm.pid).children() if c.pid != not_pid]
        except psutil.Error:
            return None
        return kids[0] if kids else None

    def done(self) -> int:
        return int(self.r.scard("bench:done"))

    def dead(self) -> int:
        return int(self.r.zcard("dead"))

    def stop(self, swarm: subprocess.Popen[bytes]) -> None:
        """KILL the swarm and every child: a child is in a process group of its own,
        and one left draining would claim the next scenario's jobs."""
        try:
            procs = [psutil.Process(swarm.pid), *psutil.Process(swarm.pid).children(True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        swarm.wait(10)

    def close(self) -> None:
        self.server.kill()
        self.server.wait(10)


def storm(bench: Bench, args: argparse.Namespace) -> str:
    swarm = bench.swarm(args.storm_concurrency)
    try:
        bench.push(args.storm_jobs, args.storm_job_seconds)
        bench.wait(lambda: int(bench.r.get("bench:started") or 0) > 0, 60)
        kills, ends = 0, time.monotonic() + args.storm_seconds
        while time.monotonic() < ends and bench.done() < args.storm_jobs:
            time.sleep(args.storm_every)
            pid = bench.child(swarm)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                kills += 1
        last_kill = time.monotonic()
        finished = bench.wait(lambda: bench.done() + bench.dead() >= args.storm_jobs)
        drained = time.monotonic() - last_kill
        return (f"storm: {kills} kills, {bench.dead()} in dead, {bench.done()}/{args.storm_jobs}"
                f" done, {'all settled' if finished else 'NOT all settled'}"
                f" {drained:.1f} s after the last kill")
    finally:
        bench.stop(swarm)


def single_kill(bench: Bench, args: argparse.Namespace) -> str:
    swarm = bench.swarm(args.kill_concurrency)
    try:
        bench.push(args.kill_jobs, args.kill_job_seconds)
        full = min(args.kill_concurrency, args.kill_jobs)
        bench.wait(lambda: int(bench.r.get("bench:started") or 0) >= full, 120)
        victim = bench.child(swarm)
        assert victim is not None
        in_flight = full - bench.done()
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        finished = bench.wait(lambda: bench.done() + bench.dead() >= args.kill_jobs)
        took = time.monotonic() - killed_at
        return (f"kill: {args.kill_jobs} x {args.kill_job_seconds} s jobs at -c "
                f"{args.kill_concurrency}, one SIGKILL with {in_flight} in flight: "
                f"{'all' if finished else 'NOT all'} done {took:.1f} s after the kill "
                f"({bench.done()} done, {bench.dead()} in dead)")
    finally:
        bench.stop(swarm)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("storm", "kill", "all"), default="all")
    parser.add_argument("--repo", type=Path, default=REPO, help="the wurk checkout to run")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--executor", choices=("threads", "asyncio"), default="threads")
    parser.add_argument("--storm-concurrency", type=int, default=10)
    parser.add_argument("--storm-jobs", type=int, default=200)
    parser.add_argument("--storm-job-seconds", type=float, default=2.0)
    parser.add_argument("--storm-seconds", type=float, default=60.0)
    parser.add_argument("--storm-every", type=float, default=2.5)
    parser.add_argument("--kill-jobs", type=int, default=300)
    parser.add_argument("--kill-job-seconds", type=float, default=1.0)
    parser.add_argument("--kill-concurrency", type=int, default=100)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if shutil.which("redis-server") is None:
        print("redis-server is not on PATH", file=sys.stderr)
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="wurk-bench-recovery-"))
    bench = Bench(args.repo.resolve(), scratch, args.timeout, args.executor)
    try:
        print(f"wurk from {args.repo.resolve()}, {args.executor} executor")
        if args.scenario in ("storm", "all"):
            print(storm(bench, args), flush=True)
        if args.scenario in ("kill", "all"):
            print(single_kill(bench, args), flush=True)
    finally:
        bench.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

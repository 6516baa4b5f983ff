"""A long chaos round: does a swarm under fire lose jobs?

    python bench/chaos.py [--jobs 50000] [--reliable-fetch on|off] [--rate 500]

What it does:
1. Starts its own redis-server (free loopback port, temp dir, ``appendonly
   yes``, ``appendfsync always``) and a fault proxy in front of it
   (``tests/faultproxy.py``).
2. Starts ``wurk-swarm`` with a two-slot topology (one child of
   ``--concurrency`` threads per slot, both on ``default``) that reaches
   Redis only through the proxy, with ``reliable_fetch`` per the flag.
3. Pushes N ``bench.chaos_jobs.chaos_record`` jobs at a steady ``--rate``
   through a buffered client (reliable push) connected straight to Redis.
   Each job sleeps ``--job-seconds`` and RPUSHes its jid to ``done`` over its
   own direct connection (so ``done`` counts executions, see chaos_jobs.py).
4. Meanwhile: SIGKILLs a random (booted) child every 1-3 s; blips the proxy
   every 2-4 s (refused dials, a lost request, a lost reply, half-closed
   sockets, replies held past the read timeout); and once, at 40 % of the
   push, SIGKILLs redis-server and restarts it on its AOF a second later.
5. Waits (bounded by ``--drain-timeout``) until every pushed jid is in
   ``done``, or the queue is empty and ``done`` stopped growing.
6. Prints pushed, executed (unique), LOST, duplicates, kills, the jobs the
   killed children held in their private lists just before each kill (with
   reliable fetch, the bound on duplicates), and for every fault the time
   until ``done`` grew again. Always exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests"):  # run as a file: bench.*, wurk and the fault proxy
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from faultproxy import FaultProxy  # noqa: E402

import wurk  # noqa: E402
from bench.chaos_jobs import DONE, JOB  # noqa: E402
from wurk.redis.runtime import close_runtime  # noqa: E402
from wurk.settings.config import Config  # noqa: E402
from wurk.wire.payload import new_jid  # noqa: E402

SAMPLE = 0.02          # how often the monitor reads len(done)
CHILD_MIN_AGE = 1.5    # kill only children this old (a booting child is another story)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProc:
    """redis-server with an fsync-always AOF; restartable on the same port and dir."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = (self.workdir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as probe:
                    if probe.ping():
                        return
            except redis.RedisError:
                time.sleep(0.02)
        raise SystemExit("redis-server did not start")

    def crash(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Fault:
    at: float          # monotonic
    kind: str
    detail: str
    recovered: float | None = None


@dataclass
class Monitor:
    """Samples len(done) so the time from each fault to the next progress can be read."""

    url: str
    samples: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=0.5)
        while not self._stop.is_set():
            with contextlib.suppress(redis.RedisError):
                self.samples.append((time.monotonic(), int(client.llen(DONE))))
            self._stop.wait(SAMPLE)
        client.close()

    def stop(self) -> None:
        self._stop.set()

    def recovery(self, at: float) -> float | None:
        """Seconds from ``at`` until len(done) first exceeds what it was at ``at``."""
        times = [t for t, _ in self.samples]
        i = bisect_right(times, at)
        if i == 0 or i >= len(self.samples):
            return None
        base = self.samples[i - 1][1]
        for t, n in self.samples[i:]:
            if n > base:
                return t - at
        return None


@dataclass
class Pusher:
    client: wurk.Client
    total: int
    rate: float
    job_seconds: float
    accepted: list[str] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)
    full: int = 0
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        for i in range(self.total):
            delay = started + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            jid = new_jid()
            try:
                self.client.push({"class": JOB, "args": [jid, self.job_seconds], "jid": jid,
                                  "retry": 3})
            except wurk.PushBufferFullError:
                self.full += 1
            except Exception:  # noqa: BLE001 - sent, outcome unknown: counted apart
                self.uncertain.append(jid)
            else:
                self.accepted.append(jid)
        self.finished.set()


class Chaos:
    def __init__(self, swarm: subprocess.Popen[bytes], proxy: FaultProxy, server: RedisProc,
                 rng: random.Random, until: threading.Event, r: redis.Redis) -> None:
        self.swarm = swarm
        self.proxy = proxy
        self.server = server
        self.rng = rng
        self.until = until
        self.r = r
        self.faults: list[Fault] = []
        # Jobs the killed children held in their private lists just before
        # each kill: the most that can run twice (finished, not yet acked).
        self.in_flight_at_kills = 0
        self.unmeasured_kills = 0
        self._lock = threading.Lock()

    def note(self, kind: str, detail: str) -> None:
        with self._lock:
            self.faults.append(Fault(time.monotonic(), kind, detail))

    def kills(self) -> None:
        while not self.until.wait(self.rng.uniform(1, 3)):
            victims = booted_children(self.swarm.pid)
            if not victims:
                continue
            pid = self.rng.choice(victims)
            held = self.held_by(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.note("kill", f"child {pid}, holding {held if held is not None else '?'}")
                if held is None:
                    self.unmeasured_kills += 1
                else:
                    self.in_flight_at_kills += held

    def held_by(self, pid: int) -> int | None:
        """Jobs in the private lists of the child with this pid (None if Redis is away)."""
        try:
            # Identities are host:pid:nonce, private lists wurk:wip:<identity>:<queue>.
            return sum(int(self.r.llen(k)) for k in self.r.scan_iter(match=f"wurk:wip:*:{pid}:*"))
        except redis.RedisError:
            return None

    def blips(self) -> None:
        kinds = ["refuse", "drop_request", "drop_reply", "half_close", "delay"]
        while not self.until.wait(self.rng.uniform(2, 4)):
            kind = self.rng.choice(kinds)
            if kind == "refuse":
                seconds = self.rng.uniform(0.3, 1.0)
                self.note("blip", f"proxy refuses dials for {seconds:.1f}s")
                self.proxy.refuse()
                time.sleep(seconds)
                self.proxy.heal()
            elif kind == "drop_request":
                self.note("blip", "proxy drops the next request")
                self.proxy.drop_next_request()
            elif kind == "drop_reply":
                self.note("blip", "proxy drops the next reply")
                self.proxy.drop_next_reply()
            elif kind == "half_close":
                self.note("blip", "proxy half-closes every connection")
                self.proxy.half_close()
            else:
                self.note("blip", "proxy holds replies 3s (past the 2.5s read timeout)")
                self.proxy.delay(3.0)
                time.sleep(1.0)
                self.proxy.delay(0)

    def restart_redis(self, after: float) -> None:
        if self.until.wait(after):
            return
        self.note("redis", "redis-server SIGKILLed, restarted on its AOF 1s later")
        self.server.crash()
        time.sleep(1.0)
        self.server.start()


def booted_children(swarm_pid: int) -> list[int]:
    try:
        children = psutil.Process(swarm_pid).children()
    except psutil.NoSuchProcess:
        return []
    now = time.time()
    found = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE and now - child.create_time() >= \
                    CHILD_MIN_AGE:
                found.append(child.pid)
    return found


def write_topology(path: Path, url: str, reliable: bool, concurrency: int) -> None:
    slots = "".join(
        f'\n[[slot]]\nname = "{name}"\ncount = 1\nconcurrency = {concurrency}\n'
        f'queues = ["default"]\n' for name in ("alpha", "beta"))
    path.write_text(
        "[wurk]\n"
        f'redis_url = "{url}"\n'
        'require = ["bench.chaos_jobs"]\n'
        f"reliable_fetch = {'true' if reliable else 'false'}\n"
        'log_level = "warning"\nlog_format = "json"\n'
        "heartbeat_interval = 1.0\nfetch_timeout = 1.0\nshutdown_timeout = 5\n"
        "shutdown_grace = 2\n"
        # Our kills are not a crash loop, and our kills' jobs are no poison pills;
        # a child respawned while Redis restarts fails its boot: keep trying.
        "respawn_backoff_max = 1.0\nmax_recoveries = 1000\nboot_failure_limit = 1000\n"
        + slots, encoding="utf-8")


def drain(r: redis.Redis, jids: list[str], timeout: float) -> float:
    """Wait until every jid is done, or nothing moves any more; returns seconds waited."""
    wanted = set(jids)
    started = last_change = time.monotonic()
    last = -1
    while time.monotonic() - started < timeout:
        try:
            done = r.lrange(DONE, 0, -1)
            queued = r.llen("queue:default")
        except redis.RedisError:
            time.sleep(0.5)
            continue
        if wanted <= set(done):
            break
        if len(done) != last:
            last, last_change = len(done), time.monotonic()
        elif queued == 0 and time.monotonic() - last_change > 15:
            break  # nothing left to run and nothing running: the rest is lost
        time.sleep(0.5)
    return time.monotonic() - started


def summarise(label: str, values: list[float]) -> str:
    if not values:
        return f"{label}: n/a"
    return (f"{label}: n={len(values)} median {statistics.median(values):.2f}s "
            f"max {max(values):.2f}s")


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - a linear script
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--reliable-fetch", choices=("on", "off"), default="on")
    parser.add_argument("--rate", type=float, default=500.0, help="pushes per second")
    parser.add_argument("--concurrency", type=int, default=10, help="threads per child")
    parser.add_argument("--job-seconds", type=float, default=0.005)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args(argv)
    reliable = args.reliable_fetch == "on"
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    workdir = Path(tempfile.mkdtemp(prefix="wurk-chaos-"))
    server = RedisProc(workdir)
    proxy = FaultProxy(server.port)
    topology = workdir / "topology.toml"
    write_topology(topology, proxy.url, reliable, args.concurrency)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update({"PYTHONPATH": str(ROOT), "CHAOS_DONE_URL": server.url, "REDIS_URL": proxy.url})
    swarm_log = (workdir / "swarm.log").open("wb")
    swarm = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--topology",
                              str(topology)], cwd=ROOT, env=env, stdout=swarm_log,
                             stderr=swarm_log, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    unsafe: list[str] = []
    config = Config(redis_url=server.url, redis_retry_base=0.05, redis_retry_cap=0.5,
                    push_buffer_size=max(10_000, args.jobs), log_level="error",
                    on_redis_error=lambda e, *, attempt, action: (
                        unsafe.append(str(e)) if action == "unsafe" else None))
    client = wurk.Client(config)
    pusher = Pusher(client, args.jobs, args.rate, args.job_seconds)
    monitor = Monitor(server.url)
    r = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
    print(f"wurk chaos: {args.jobs} jobs at {args.rate:.0f}/s, reliable fetch "
          f"{args.reliable_fetch}, 2 slots x 1 child x {args.concurrency} threads, "
          f"seed {seed}, " + (f"logs kept in {workdir}" if args.keep else "--keep keeps the logs"),
          flush=True)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 20
        while len(booted_children(swarm.pid)) < 2:
            if time.monotonic() > deadline or swarm.poll() is not None:
                raise SystemExit(f"the swarm did not boot; see {workdir / 'swarm.log'}")
            time.sleep(0.1)
        stop_chaos = threading.Event()
        chaos = Chaos(swarm, proxy, server, rng, stop_chaos, r)
        threads = [threading.Thread(target=t, daemon=True, name=t.__name__) for t in
                   (monitor.run, pusher.run, chaos.kills, chaos.blips)]
        push_seconds = args.jobs / args.rate
        threads.append(threading.Thread(target=chaos.restart_redis, args=(0.4 * push_seconds,),
                                        daemon=True))
        for thread in threads:
            thread.start()
        pusher.finished.wait()
        stop_chaos.set()
        for thread in threads[2:]:
            thread.join(10)
        proxy.heal()
        pushed_at = time.monotonic()
        assert client.buffer is not None
        flushed = client.buffer.flush(60)
        waited = drain(r, pusher.accepted, args.drain_timeout)
        monitor.stop()
        threads[0].join(5)

        done = r.lrange(DONE, 0, -1)
        seen = set(done)
        lost = [j for j in pusher.accepted if j not in seen]
        duplicates = len(done) - len(seen)
        for fault in chaos.faults:
            fault.recovered = monitor.recovery(fault.at)
        kills = [f for f in chaos.faults if f.kind == "kill"]
        print(f"\nran {pushed_at - started:.1f}s under fire, then drained for {waited:.1f}s "
              f"(buffer flushed: {flushed})")
        landed = sum(j in seen for j in pusher.uncertain)
        print(f"pushed            {len(pusher.accepted)} accepted"
              f" (+{len(pusher.uncertain)} raised with outcome unknown, of which {landed} ran;"
              f" {pusher.full} refused: buffer full; {len(unsafe)} 'unsafe' reports)")
        print(f"executed (unique) {len(seen & set(pusher.accepted))}")
        print(f"lost              {len(lost)}")
        print(f"duplicates        {duplicates}")
        print(f"kills             {len(kills)}")
        if args.reliable_fetch == "on":
            within = "within" if duplicates <= chaos.in_flight_at_kills else "ABOVE"
            unmeasured = (f", {chaos.unmeasured_kills} kill(s) unmeasured (Redis away)"
                          if chaos.unmeasured_kills else "")
            print(f"in flight at kills {chaos.in_flight_at_kills} (in the killed children's "
                  f"private lists); duplicates {within} that bound{unmeasured}")
        private = sum(r.llen(k) for k in r.keys("wurk:wip:*:*"))
        print(f"left over         queue={r.llen('queue:default')} retry={r.zcard('retry')} "
              f"dead={r.zcard('dead')} private lists={private}")
        print("\nfaults (t from start, time until done grew again):")
        for fault in chaos.faults:
            took = f"{fault.recovered:.2f}s" if fault.recovered is not None else "never"
            print(f"  t={fault.at - started:6.1f}s  {fault.kind:5s} {fault.detail:50s} {took}")
        for kind in ("kill", "blip", "redis"):
            print(summarise(f"recovery after {kind}",
                            [f.recovered for f in chaos.faults
                             if f.kind == kind and f.recovered is not None]))
        print()
        if lost:
            print(f"LOST {len(lost)} JOBS (reliable fetch {args.reliable_fetch}); "
                  f"e.g. {lost[:5]}")
        else:
            print(f"LOST 0: every accepted job ran (reliable fetch {args.reliable_fetch})")
    finally:
        monitor.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(swarm.pid, signal.SIGTERM)
        try:
            swarm.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(swarm.pid, signal.SIGKILL)
            swarm.wait(5)
        swarm_log.close()
        proxy.close()
        r.close()
        close_runtime(config)
        server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos: real worker processes, real faults, and not one job lost.

Every job is ``bench.chaos_jobs.chaos_record``: it RPUSHes its jid to
``done`` through its own connection straight to Redis. In (a) that
connection bypasses the fault proxy on purpose: the faults are aimed at the
worker's fetch, ack, requeue and heartbeat traffic, and a job whose own
bookkeeping was faulted would blur "the fetch path ran it twice" with "its
RPUSH reply was lost". ``done`` therefore lists executions.

(a) a ``wurk run`` behind a FaultProxy: dropped requests and replies,
    delays past the read timeout, half-closes and refused dials;
(b) redis-server SIGKILLed and restarted on its AOF (``appendfsync always``)
    while jobs are pushed (buffered) and worked;
(c) a two-child ``wurk-swarm`` whose children are SIGKILLed again and again.

Each asserts lost = 0 and prints its figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from conftest import RedisServer, reap_probe_clients, start_redis
from faultproxy import FaultProxy
from pushing import Pusher
from redis.backoff import NoBackoff
from redis.retry import Retry

import wurk
from wurk.redis.policy import ConnectError
from wurk.redis.runtime import close_runtime
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.settings.config import Config
from wurk.settings.queues import parse_queues
from wurk.wire import keys
from wurk.wire.lua import CLAIM
from wurk.wire.payload import new_jid

REPO = Path(__file__).resolve().parent.parent
JOB = "chaos_record"
FAST = {
    "WURK_HEARTBEAT_INTERVAL": "0.5",
    "WURK_FETCH_TIMEOUT": "0.5",
    "WURK_POLL_INTERVAL_AVERAGE": "0.5",
    "WURK_REDIS_READ_TIMEOUT": "1",
    "WURK_REDIS_RETRY_BASE": "0.05",
    "WURK_REDIS_RETRY_CAP": "0.5",
    "WURK_RELIABLE_FETCH": "true",
    "WURK_SHUTDOWN_TIMEOUT": "2",
}


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """The predicate's first truthy value, or its last value once time is up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except redis.RedisError:
            value = None
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def env_for(redis_url: str, done_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WURK_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env.update(FAST)
    env.update({"REDIS_URL": redis_url, "CHAOS_DONE_URL": done_url, "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1", **extra})
    env.pop("DYNO", None)
    return env


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log().splitlines():
            if f'"{name}"' not in line:
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == name:
                    found.append(event)
        return found


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start a subprocess in its own session; SIGKILL its whole group afterwards."""
    started: list[Proc] = []

    def start(argv: list[str], env: dict[str, str]) -> Proc:
        log_path = tmp_path / f"proc-{len(started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    cwd=REPO, env=env, start_new_session=True)
        started.append(Proc(proc, log_path))
        return started[-1]

    yield start
    for one in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(one.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            one.proc.wait(10)


def wurk_run(spawn: Callable[..., Proc], env: dict[str, str], concurrency: int) -> Proc:
    return spawn([sys.executable, "-m", "wurk.cli", "run", "-r", "bench.chaos_jobs",
                  "-c", str(concurrency), "--log-level", "warning"], env)


def push_jobs(client: wurk.Client, count: int, seconds: float) -> list[str]:
    jids = []
    for _ in range(count):
        jid = new_jid()
        client.push({"class": JOB, "args": [jid, seconds], "jid": jid, "retry": 3})
        jids.append(jid)
    return jids


@dataclass
class Tally:
    pushed: int
    executed: int
    lost: list[str]
    duplicates: int

    @classmethod
    def of(cls, jids: list[str], done: list[str]) -> Tally:
        seen = set(done)
        return cls(len(jids), len(seen), [j for j in jids if j not in seen],
                   len(done) - len(seen))


def settle(r: redis.Redis, jids: list[str], timeout: float) -> Tally:
    """Wait (bounded) until every jid is in ``done``; then count."""
    wanted = set(jids)
    wait_for(lambda: wanted <= set(r.lrange("done", 0, -1)), timeout, interval=0.2)
    return Tally.of(jids, r.lrange("done", 0, -1))


def assert_none_lost_then_stop(r: redis.Redis, tally: Tally, worker: Proc) -> None:
    """Every accepted job ran; the worker lived through it all and drains to exit 0."""
    assert not tally.lost, (f"LOST {len(tally.lost)}; queue={r.llen('queue:default')} "
                            f"private={[(k, r.llen(k)) for k in r.keys('*wip*')]}")
    assert worker.proc.poll() is None, worker.log()[-3000:]
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(10) == 0, worker.log()[-3000:]


# (a) ---------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_faults_between_worker_and_redis_lose_nothing(
        redis_server: RedisServer, r: redis.Redis, spawn: Callable[..., Proc]) -> None:
    reap_probe_clients()
    proxy = FaultProxy(redis_server.port)
    config = Config(redis_url=redis_server.url, log_level="warning")
    try:
        jids = push_jobs(wurk.Client(config, buffered=False), 300, 0.1)
        worker = wurk_run(spawn, env_for(proxy.url, redis_server.url), concurrency=4)
        assert wait_for(lambda: r.llen("done") >= 10, 10), worker.log()

        rng = random.Random(7)
        faults: dict[str, int] = {}
        kinds = ["drop_request", "drop_reply", "delay", "half_close", "refuse"]
        until = time.monotonic() + 6
        while time.monotonic() < until:
            if not faults or all(faults.get(k, 0) == faults[kinds[0]] for k in kinds):
                rng.shuffle(kinds)  # every kind once per round, in a new order
            fault = next(k for k in kinds if faults.get(k, 0) == min(
                faults.get(x, 0) for x in kinds))
            faults[fault] = faults.get(fault, 0) + 1
            if fault == "drop_request":
                proxy.drop_next_request()
            elif fault == "drop_reply":
                proxy.drop_next_reply()
            elif fault == "delay":
                proxy.delay(1.5)  # past the worker's 1 s read timeout
                time.sleep(1.0)
                proxy.delay(0)
            elif fault == "half_close":
                proxy.half_close()
            else:
                proxy.refuse()
                time.sleep(0.5)
                proxy.heal()
            time.sleep(rng.uniform(0.1, 0.3))
        proxy.heal()

        tally = settle(r, jids, 15)
        seen = {name: len(worker.events(name)) for name in
                ("fetch.error", "fetch.resynced", "fetch.resync_failed", "heartbeat.error")}
        print(f"\nchaos (a) proxy faults {faults}: pushed={tally.pushed} "
              f"executed={tally.executed} lost={len(tally.lost)} "
              f"duplicates={tally.duplicates}; worker saw {seen}")
        assert_none_lost_then_stop(r, tally, worker)
    finally:
        proxy.close()
        close_runtime(config)


# (b) ---------------------------------------------------------------------------

AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def aof_server() -> Iterator[list[RedisServer]]:
    """A server with an fsync-always AOF; the test appends its restarts to the list."""
    servers = [start_redis(*AOF)]
    reap_probe_clients()
    yield servers
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(10)
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.mark.timeout(30)
def test_redis_restart_on_its_aof_loses_nothing(
        aof_server: list[RedisServer], spawn: Callable[..., Proc]) -> None:
    first = aof_server[0]
    url = first.url
    r = first.client()
    config = Config(redis_url=url, redis_retry_base=0.05, redis_retry_cap=0.2,
                    log_level="warning")
    client = wurk.Client(config)
    pusher = Pusher(client, JOB, lambda jid: [jid, 0.005])
    try:
        before = push_jobs(client, 200, 0.005)
        worker = wurk_run(spawn, env_for(url, url), concurrency=4)
        pusher.start()
        assert wait_for(lambda: r.llen("done") >= 50, 10), worker.log()

        first.proc.kill()  # a crash, not a shutdown: only the AOF survives
        first.proc.wait(5)
        killed_at = time.monotonic()
        time.sleep(1.0)
        second = start_redis(*AOF, "--dir", first.workdir, port=first.port)
        aof_server.append(second)
        reap_probe_clients()
        back_at = time.monotonic()
        r.close()
        r = second.client()
        base = r.llen("done")  # what the AOF kept
        wait_for(lambda: r.llen("done") > base, 10, 0.02)
        recovered = time.monotonic()
        time.sleep(2.0)  # more pushes after the restart
        pusher.stop()
        assert client.buffer is not None
        assert client.buffer.flush(10), f"{len(client.buffer)} pushes still buffered"

        jids = before + pusher.accepted
        tally = settle(r, jids, 15)
        print(f"\nchaos (b) redis restart: pushed={tally.pushed} "
              f"(uncertain {len(pusher.uncertain)}) executed={tally.executed} "
              f"lost={len(tally.lost)} duplicates={tally.duplicates} "
              f"down={back_at - killed_at:.1f}s "
              f"jobs done again {recovered - back_at:.1f}s after the restart")
        assert_none_lost_then_stop(r, tally, worker)
    finally:
        pusher.stop()
        r.close()
        close_runtime(config)


# (b') --------------------------------------------------------------------------

def test_pushes_refused_while_redis_loads_its_data_are_buffered_not_dropped(
        tmp_path: Path) -> None:
    """A restarted server answers LOADING until its dataset is back: a refusal,
    nothing applied. The buffered client must keep those pushes (and send them
    once loading is over), not report them as "outcome unknown"."""
    server = start_redis()
    reap_probe_clients()
    loading: subprocess.Popen[bytes] | None = None
    config: Config | None = None
    try:
        with server.client() as c:
            with c.pipeline(transaction=False) as pipe:
                for i in range(2000):
                    pipe.set(f"k{i}", "v")
                pipe.execute()
            c.save()
        server.proc.terminate()
        server.proc.wait(10)
        # 1 ms per key and events served every KB: about two seconds of LOADING.
        loading = subprocess.Popen(
            ["redis-server", "--port", str(server.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", server.workdir, "--key-load-delay", "1000",
             "--loading-process-events-interval-bytes", "1024"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # No redis-py retries: they would wait out the LOADING we want to see.
        probe = redis.Redis(port=server.port, socket_timeout=1, retry=Retry(NoBackoff(), 0))

        def answers_loading() -> bool:
            try:
                probe.ping()
            except redis.BusyLoadingError:
                return True
            except redis.ConnectionError:
                return False
            return False

        assert wait_for(answers_loading, 5, 0.01), "the server never answered LOADING"
        seen: list[tuple[str, str]] = []
        config = Config(redis_url=server.url, redis_retry_base=0.01, redis_retry_cap=0.05,
                        log_level="warning",
                        on_redis_error=lambda e, *, attempt, action: seen.append(
                            (type(e).__name__, action)))
        client = wurk.Client(config)
        jids = push_jobs(client, 5, 0)  # must not raise: a refusal is not an unknown outcome
        assert ("BusyLoadingError", "exhausted") in seen, seen
        assert "unsafe" not in {action for _, action in seen}, seen
        assert client.buffer is not None and len(client.buffer) > 0
        assert client.buffer.flush(10)
        queued = [json.loads(raw)["jid"] for raw in probe.lrange("queue:default", 0, -1)]
        assert sorted(queued) == sorted(jids)
        probe.close()
    finally:
        if config is not None:
            close_runtime(config)
        if loading is not None:
            loading.kill()
            loading.wait(10)
        shutil.rmtree(server.workdir, ignore_errors=True)


# (c) ---------------------------------------------------------------------------

def swarm_topology(path: Path, url: str, concurrency: int) -> Path:
    path.write_text(
        "[wurk]\n"
        f'redis_url = "{url}"\n'
        'require = ["bench.chaos_jobs"]\n'
        'log_level = "info"\nlog_format = "json"\n'
        "heartbeat_interval = 0.5\nfetch_timeout = 0.5\nshutdown_timeout = 2\n"
        "shutdown_grace = 2\n"
        # Killed children respawn after at most a second...
        "respawn_backoff_max = 1.0\n"
        # ...and the jobs they held are not poison pills: the kills are ours.
        "max_recoveries = 1000\n"
        "reliable_fetch = true\n\n"
        f'[[slot]]\nname = "work"\ncount = 2\nconcurrency = {concurrency}\n'
        'queues = ["default"]\n', encoding="utf-8")
    return path


def ready_children(swarm: Proc) -> set[int]:
    """Live children of the swarm that told the parent they are ready (killing
    one still booting would count as a boot failure, a different test)."""
    ready = {int(e["pid"]) for e in swarm.events("child.ready")}
    try:
        children = psutil.Process(swarm.proc.pid).children()
    except psutil.NoSuchProcess:
        return set()
    live = set()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.add(child.pid)
    return ready & live


@pytest.mark.timeout(30)
def test_swarm_children_killed_again_and_again_lose_nothing(
        redis_server: RedisServer, r: redis.Redis, spawn: Callable[..., Proc],
        tmp_path: Path) -> None:
    concurrency = 3
    config = Config(redis_url=redis_server.url, log_level="warning")
    try:
        jids = push_jobs(wurk.Client(config, buffered=False), 150, 0.2)
        topology = swarm_topology(tmp_path / "topology.toml", redis_server.url, concurrency)
        swarm = spawn([sys.executable, "-m", "supervisor.cli", "--topology", str(topology)],
                      env_for(redis_server.url, redis_server.url))
        assert wait_for(lambda: len(ready_children(swarm)) == 2, 10), swarm.log()[-3000:]
        assert wait_for(lambda: r.llen("done") >= 5, 10), swarm.log()[-3000:]

        rng = random.Random(11)
        kills = 0
        until = time.monotonic() + 5
        while time.monotonic() < until:
            victims = sorted(ready_children(swarm))
            if victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rng.choice(victims), signal.SIGKILL)
                    kills += 1
            time.sleep(rng.uniform(0.4, 0.6))

        tally = settle(r, jids, 18)
        recovered = swarm.events("reaper.recovered")
        print(f"\nchaos (c) swarm kills: kills={kills} pushed={tally.pushed} "
              f"executed={tally.executed} lost={len(tally.lost)} "
              f"duplicates={tally.duplicates} parent recoveries={len(recovered)} "
              f"(requeued {sum(e['requeued'] for e in recovered)})")
        assert not tally.lost, (f"LOST {len(tally.lost)}; queue={r.llen('queue:default')} "
                                f"private={[(k, r.llen(k)) for k in r.keys('*wip*')]}")
        assert kills >= 4
        assert tally.duplicates <= kills * concurrency
        # The parent gave the dead children's jobs back at once: a sweep would
        # have waited a minute for their heartbeats to lapse.
        assert recovered, swarm.log()[-3000:]
        assert swarm.proc.poll() is None, swarm.log()[-3000:]
        swarm.proc.send_signal(signal.SIGTERM)
        assert swarm.proc.wait(15) == 0, swarm.log()[-3000:]
    finally:
        close_runtime(config)


# (a') --------------------------------------------------------------------------

def test_a_lost_claim_is_given_back_even_when_the_first_resync_fails(
        redis_server: RedisServer, r: redis.Redis) -> None:
    """The fetcher's move lands but its reply is lost; the resync that should
    give the job back fails too, and then Redis answers again. The job must not
    stay in the private list of a live worker for as long as that worker lives."""
    reap_probe_clients()
    proxy = FaultProxy(redis_server.port)
    config = Config(redis_url=proxy.url, fetch_timeout=0.5, redis_read_timeout=1,
                    redis_retry_base=0.01, redis_retry_cap=0.05, log_level="warning")
    fetch = ReliableFetch(config, parse_queues(["default"]), "chaos-host:1:abc")
    resyncs: list[str] = []
    real_resync = fetch.resync

    def resync_failing_once() -> int:
        resyncs.append("tried")
        if len(resyncs) == 1:
            raise ConnectError("injected: Redis still away")
        return real_resync()

    fetch.resync = resync_failing_once  # type: ignore[method-assign]
    try:
        r.script_load(CLAIM.source)  # so the lost reply is the move's, not NOSCRIPT's
        fetch.start()
        [jid] = push_jobs(wurk.Client(Config(redis_url=redis_server.url), buffered=False), 1, 0)
        proxy.drop_next_reply()
        assert fetch.fetch() is None  # moved to the private list, but we never heard
        private = keys.wip("chaos-host:1:abc", "default")
        assert [json.loads(raw)["jid"] for raw in r.lrange(private, 0, -1)] == [jid]

        def fetched() -> Any:
            work = fetch.fetch()
            return work and json.loads(work.raw)["jid"]

        assert wait_for(fetched, 5, 0) == jid, (resyncs, r.keys("*"))
        assert resyncs[0] == "tried" and len(resyncs) >= 2
    finally:
        fetch.stop()
        proxy.close()
        close_runtime(config)

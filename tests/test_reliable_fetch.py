"""Reliable fetch, the reaper and poison pills: real Redis, real threads and processes.

The contract: a claimed job sits in the process's private list
(``wurk:wip:<identity>:<queue>``) until it is acknowledged; a dead process's
lists go back to their queues (or to ``dead`` after too many recoveries);
quiet, paused queues and hard stops never strand or duplicate a job.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from conftest import RedisServer, fill_to_maxmemory
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from waiting import wait_for

from wurk.push.job import JobFunction
from wurk.redis.pools import close_pool, pool_for
from wurk.runtime.launcher import Launcher
from wurk.runtime.reaper import recover, sweep
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import new_jid

REPO = Path(__file__).resolve().parent.parent

Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


def payload(cls: str, *args: Any, queue: str = "default", jid: str | None = None) -> bytes:
    """Hand-written JSON with odd spacing and non-ASCII text: any re-serialisation shows."""
    body = json.dumps({"class": cls, "args": list(args), "jid": jid or new_jid(),
                       "queue": queue, "retry": True, "note": "café ☕",
                       "created_at": 1700000000.5}, ensure_ascii=False)
    return body.replace(", ", ",  ", 1).encode()


def jid_of(raw: bytes) -> str:
    jid: str = json.loads(raw)["jid"]
    return jid


def wip(identity: str, queue: str) -> str:
    return keys.wip(identity, queue)


def private_lists(rb: redis.Redis, identity: str) -> list[bytes]:
    found: list[bytes] = list(rb.scan_iter(match=f"{keys.wip_prefix(identity)}*"))
    return found


@pytest.fixture
def rb(redis_server: RedisServer, r: redis.Redis) -> Iterator[redis.Redis]:
    """A bytes client (no decoding) for byte-for-byte comparisons; ``r`` already flushed."""
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    yield client
    client.close()


def reliable(launcher: Launcher) -> ReliableFetch:
    fetch = launcher.manager.fetch
    assert isinstance(fetch, ReliableFetch)
    return fetch


def blocked_in_brpoplpush(r: redis.Redis) -> bool:
    # "cmd" is a connection's last command, blocked in it or long done: the
    # "b" flag says it is blocked now.
    return any(c.get("cmd") == "brpoplpush" and "b" in c.get("flags", "")
               for c in r.client_list())


class Gate:
    """A job body that records it started, then waits to be released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.runs: list[str] = []

    def run(self, tag: str) -> None:
        self.runs.append(tag)
        self.started.set()
        try:
            self.release.wait(5)
        finally:
            self.finished.set()


class Gated(NamedTuple):
    gate: Gate
    job: JobFunction[..., Any]
    raw: bytes
    launcher: Launcher


def launch_gated(rb: redis.Redis, define: Define, launch: Launch, tag: str) -> Gated:
    """Queue one job that waits behind a :class:`Gate`, then start a launcher."""
    gate = Gate()
    job = define(gate.run)
    raw = payload(job.name, tag)
    rb.lpush("queue:default", raw)
    return Gated(gate, job, raw, launch())


# -- 1. claim and ack -----------------------------------------------------------------------


def test_running_job_sits_in_private_list_and_ack_clears_it_and_its_pill(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    gate = Gate()
    job = define(gate.run)
    raw = payload(job.name, "one")
    pill = keys.pill(jid_of(raw))
    rb.set(pill, 2)
    rb.expire(pill, 3600)
    rb.sadd("queues", "default")
    rb.lpush("queue:default", raw)
    launcher = launch()
    try:
        assert gate.started.wait(3)
        mine = wip(launcher.identity, "default")
        assert rb.lrange(mine, 0, -1) == [raw]
        assert rb.llen("queue:default") == 0
        assert launcher.identity in r.smembers(keys.WIP_OWNERS)
        assert "default" in r.smembers(keys.wip_queues(launcher.identity))
        assert rb.get(pill) == b"2"
    finally:
        gate.release.set()
    wait_for(lambda: rb.llen(mine) == 0 and not rb.exists(pill))
    assert not rb.exists(mine)
    assert rb.llen("queue:default") == 0
    assert gate.runs == ["one"]
    launcher.stop()
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    assert int(r.get("stat:processed") or 0) == 1


# -- 2. a killed process's jobs come back --------------------------------------------------

JOBS_MODULE = textwrap.dedent("""
    import os
    import signal
    import time

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job(name="rf_hang")
    def hang(tag):
        _r.incr("rf:started")
        deadline = time.monotonic() + 30
        while _r.exists("rf:hang") and time.monotonic() < deadline:
            time.sleep(0.05)
        _r.rpush("rf:ran", tag)
        _r.incr("rf:done")


    @wurk.job(name="rf_nap")
    def nap(tag, seconds):
        time.sleep(seconds)
        _r.rpush("rf:ran", tag)


    @wurk.job(name="rf_crash")
    def crash():
        _r.incr("rf:crashes")
        os.kill(os.getpid(), signal.SIGKILL)
""")


class Worker:
    """One ``wurk run`` child; stderr goes to a file so a full pipe never blocks it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.stderr_path = cwd / f"stderr-{new_jid()}.log"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wurk.cli", "run", *args], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._stderr.close()


@pytest.fixture
def spawn(redis_server: RedisServer, r: redis.Redis,
          tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    (tmp_path / "rfjobs.py").write_text(JOBS_MODULE)
    workers: list[Worker] = []

    def start(*args: str) -> Worker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
        env.pop("DYNO", None)
        env.update({"REDIS_URL": redis_server.url,
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
                    "WURK_HEARTBEAT_INTERVAL": "0.2", "WURK_FETCH_TIMEOUT": "0.5",
                    "PYTHONUNBUFFERED": "1"})
        worker = Worker(["-r", "rfjobs", "--log-level", "info", *args], env, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def test_sigkilled_process_jobs_are_recovered_and_run_elsewhere(
        r: redis.Redis, rb: redis.Redis, config: Config,
        spawn: Callable[..., Worker]) -> None:
    raws = [payload("rf_hang", f"job-{i}", queue="rfk") for i in range(2)]
    r.set("rf:hang", 1)
    rb.sadd("queues", "rfk")
    for raw in raws:
        rb.lpush("queue:rfk", raw)
    queued = rb.lrange("queue:rfk", 0, -1)
    worker = spawn("-q", "rfk", "-c", "2")
    wait_for(lambda: int(r.get("rf:started") or 0) == 2 or not worker.alive(), timeout=10)
    assert worker.alive(), worker.stderr()
    (identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    mine = wip(identity, "rfk")
    assert sorted(rb.lrange(mine, 0, -1)) == sorted(raws)
    assert rb.llen("queue:rfk") == 0

    worker.proc.send_signal(signal.SIGKILL)
    assert worker.proc.wait(5) == -signal.SIGKILL
    # Dead, but its heartbeat has not lapsed yet: nobody may take its jobs.
    r.delete(keys.REAPER_LOCK)  # taken by the child's boot sweep
    assert sweep(config) == 0
    assert sorted(rb.lrange(mine, 0, -1)) == sorted(raws)
    assert r.get("rf:done") is None

    r.delete(identity)  # what the 60 s TTL would do
    r.delete(keys.REAPER_LOCK)
    assert sweep(config) == 1
    assert rb.lrange("queue:rfk", 0, -1) == queued  # byte for byte, in the same order
    assert not rb.exists(mine)
    assert identity not in r.smembers(keys.WIP_OWNERS)
    assert not r.exists(keys.wip_queues(identity))
    # Two jobs died together: neither is blamed, both are suspects now.
    for raw in raws:
        assert r.get(keys.pill(jid_of(raw))) is None
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted(raws)

    r.delete("rf:hang")
    second = spawn("-q", "rfk", "-c", "2")
    wait_for(lambda: int(r.get("rf:done") or 0) == 2 or not second.alive(), timeout=10)
    assert second.alive(), second.stderr()
    assert sorted(r.lrange("rf:ran", 0, -1)) == ["job-0", "job-1"]
    assert int(r.get("rf:started") or 0) == 4
    (second_identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    assert second_identity != identity
    wait_for(lambda: not rb.exists(wip(second_identity, "rfk")))  # both acked
    assert rb.llen("queue:rfk") == 0
    assert not rb.exists(keys.SUSPECTS)  # each finished a run: cleared
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(5) == 0, second.stderr()
    assert r.smembers(keys.WIP_OWNERS) == set()


def test_a_job_that_kills_its_process_dies_alone_and_its_neighbours_complete(
        r: redis.Redis, rb: redis.Redis, config: Config,
        spawn: Callable[..., Worker]) -> None:
    """One crasher among 20 jobs, 4 threads: the jobs that were running
    beside it when it took the process down must not share its blame."""
    config.max_recoveries = 2
    innocents = [payload("rf_nap", f"innocent-{n}", 0.2, queue="rfx") for n in range(20)]
    crasher = payload("rf_crash", queue="rfx")
    rb.sadd("queues", "rfx")
    for raw in [*innocents[:2], crasher, *innocents[2:]]:  # the third one fetched
        rb.lpush("queue:rfx", raw)
    def dies_or_drains(worker: Worker) -> bool:
        return not worker.alive() or not (rb.llen("queue:rfx") or private_lists(rb, "*"))

    deaths = 0
    while deaths < 8:
        worker = spawn("-q", "rfx", "-c", "4")
        wait_for(functools.partial(dies_or_drains, worker), timeout=20,
                 what=f"worker {deaths + 1} dies or drains")
        if worker.alive():
            break
        assert worker.proc.wait(5) == -signal.SIGKILL, worker.stderr()
        deaths += 1
        (identity,) = r.smembers(keys.WIP_OWNERS)
        recover(config, str(identity))  # what the swarm parent does when it reaps a child
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(10) == 0, worker.stderr()

    completed = set(r.lrange("rf:ran", 0, -1))
    dead = rb.zrange("dead", 0, -1)
    innocents_dead = sum(raw in dead for raw in innocents)
    print(f"\n{deaths} crashes; innocents completed {len(completed)}/20, "
          f"innocents dead {innocents_dead}, crasher dead {crasher in dead}")
    assert innocents_dead == 0
    assert completed == {f"innocent-{n}" for n in range(20)}
    assert dead == [crasher]
    # Blamed only for the crashes it caused alone: max_recoveries + 1 of them
    # (its first, beside other jobs, made it a suspect).
    assert int(r.get("rf:crashes") or 0) == deaths == config.max_recoveries + 2
    assert rb.llen("queue:rfx") == 0
    assert not rb.exists(keys.SUSPECTS)


# -- 3. the reaper leaves the living alone and honours its lock ------------------------------


def fake_dead_owner(rb: redis.Redis, identity: str, queue: str, *raws: bytes) -> None:
    """What a process leaves behind when it dies mid-job (its heartbeat long gone)."""
    for raw in raws:
        rb.lpush(wip(identity, queue), raw)
    rb.sadd(keys.WIP_OWNERS, identity)
    rb.sadd(keys.wip_queues(identity), queue)


def test_reaper_spares_live_processes_and_respects_its_lock(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    gate, job, live_raw, launcher = launch_gated(rb, define, launch, "live")
    try:
        assert gate.started.wait(3)
        wait_for(lambda: r.exists(keys.REAPER_LOCK))  # the launcher's boot sweep...
        time.sleep(0.2)  # ...has read the owners by now
        assert r.exists(launcher.identity)  # its heartbeat hash
        dead_a = payload(job.name, "dead-a", queue="rfdead")
        fake_dead_owner(rb, "ghost:1:aaaaaaaaaaaa", "rfdead", dead_a)

        # Lock held: this sweep does nothing at all.
        assert sweep(config) == 0
        assert rb.lrange(wip("ghost:1:aaaaaaaaaaaa", "rfdead"), 0, -1) == [dead_a]
        ttl = r.ttl(keys.REAPER_LOCK)
        assert 0 < ttl <= max(1, int(config.reaper_interval / 2))

        r.delete(keys.REAPER_LOCK)
        assert sweep(config) == 1
        assert rb.lrange("queue:rfdead", 0, -1) == [dead_a]
        assert "ghost:1:aaaaaaaaaaaa" not in r.smembers(keys.WIP_OWNERS)
        # The live process keeps its running job and its ownership.
        assert rb.lrange(wip(launcher.identity, "default"), 0, -1) == [live_raw]
        assert launcher.identity in r.smembers(keys.WIP_OWNERS)
        assert r.get(keys.pill(jid_of(live_raw))) is None
        assert 0 < r.ttl(keys.REAPER_LOCK) <= max(1, int(config.reaper_interval / 2))

        # A second sweep inside the lock's lifetime: another dead owner waits.
        dead_b = payload(job.name, "dead-b", queue="rfdead")
        fake_dead_owner(rb, "ghost:2:bbbbbbbbbbbb", "rfdead", dead_b)
        assert sweep(config) == 0
        assert rb.lrange(wip("ghost:2:bbbbbbbbbbbb", "rfdead"), 0, -1) == [dead_b]
        assert "ghost:2:bbbbbbbbbbbb" in r.smembers(keys.WIP_OWNERS)
    finally:
        gate.release.set()
    wait_for(lambda: not rb.exists(wip(launcher.identity, "default")))
    assert gate.runs == ["live"]


# -- 4. poison pills ------------------------------------------------------------------------


def test_job_recovered_too_often_goes_to_dead(r: redis.Redis, rb: redis.Redis,
                                              config: Config) -> None:
    assert config.max_recoveries == 3
    raw = payload("Poison", "x", queue="rfp")
    pill = keys.pill(jid_of(raw))
    for attempt in range(1, 5):
        identity = f"doomed:{attempt}:cafecafecafe"
        # The job was claimed from its queue by a process that then died.
        if attempt > 1:
            assert rb.rpoplpush("queue:rfp", wip(identity, "rfp")) == raw
        else:
            rb.lpush(wip(identity, "rfp"), raw)
        rb.sadd(keys.WIP_OWNERS, identity)
        rb.sadd(keys.wip_queues(identity), "rfp")
        before = time.time()
        requeued, killed = recover(config, identity)
        assert r.get(pill) == str(attempt)
        assert keys.PILL_TTL - 5 < r.ttl(pill) <= keys.PILL_TTL
        assert not rb.exists(wip(identity, "rfp"))
        assert identity not in r.smembers(keys.WIP_OWNERS)
        assert not r.exists(keys.wip_queues(identity))
        if attempt <= 3:
            assert (requeued, killed) == (1, 0)
            assert rb.lrange("queue:rfp", 0, -1) == [raw]
            assert r.zcard("dead") == 0
        else:
            assert (requeued, killed) == (0, 1)
            assert rb.llen("queue:rfp") == 0
            assert rb.zrange("dead", 0, -1) == [raw]
            at = rb.zscore("dead", raw)
            assert at is not None
            assert before - 1 <= at <= time.time() + 1
    assert r.get(pill) == "4"


def test_recover_requeues_malformed_payloads_without_crashing(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
    good = payload("Good", 1, queue="rfm")
    odd: list[bytes] = [b"not json {", b"[1, 2]", b'{"jid": null}', b'{"jid": 42}', b"42",
                        b"\xff\xfe\x00binary", b'"a string"', b"", good]
    # Alone in a dead process's lists a job is blamed, so its jid is looked for.
    for n, raw in enumerate(odd):
        identity = f"broken:{n}:deadbeefdead"
        fake_dead_owner(rb, identity, "rfm", raw)
        assert recover(config, identity) == (1, 0)
        assert identity not in r.smembers(keys.WIP_OWNERS)
    assert rb.lrange("queue:rfm", 0, -1) == odd
    assert [k.decode() for k in rb.scan_iter(match="wurk:pill:*")] == [keys.pill(jid_of(good))]
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted(odd)
    rb.delete("queue:rfm")

    # All together: claimed in this order, the private list holds the newest first.
    identity = "broken:all:deadbeefdead"
    fake_dead_owner(rb, identity, "rfm", *odd)
    assert recover(config, identity) == (len(odd), 0)
    # Oldest claimed ends nearest the fetch (right) end.
    assert rb.lrange("queue:rfm", 0, -1) == list(reversed(odd))
    assert r.get(keys.pill(jid_of(good))) == "1"  # from before: not blamed again
    assert "rfm" in r.smembers("queues")
    assert identity not in r.smembers(keys.WIP_OWNERS)
    assert r.zcard("dead") == 0


def test_a_suspect_runs_alone_and_a_busy_process_leaves_it_queued(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 3
    config.queues = ["rfs"]
    config.fetch_timeout = 2.0  # the idle threads' BRPOPLPUSH is what takes the suspect
    held = {"busy": threading.Event(), "suspect": threading.Event()}
    ran: list[str] = []

    def work(tag: str) -> None:
        ran.append(tag)
        if tag in held:
            held[tag].wait(10)

    job = define(work)
    busy, first, second, normal = (payload(job.name, tag, queue="rfs")
                                   for tag in ("busy", "suspect", "other-suspect", "normal"))
    rb.lpush("queue:rfs", busy)
    launcher = launch()
    mine = wip(launcher.identity, "rfs")
    try:
        wait_for(lambda: ran == ["busy"] and blocked_in_brpoplpush(r))
        # A dead process held two jobs: both come back as suspects, neither blamed.
        fake_dead_owner(rb, "ghost:9:cccccccccccc", "rfs", first, second)
        assert recover(config, "ghost:9:cccccccccccc") == (2, 0)
        rb.lpush("queue:rfs", normal)
        # The blocked move took the first suspect, and gave it back: we are busy.
        wait_for(lambda: not blocked_in_brpoplpush(r), timeout=3)
        time.sleep(0.5)
        assert ran == ["busy"]
        assert rb.lrange("queue:rfs", 0, -1) == [normal, second, first]
        assert rb.lrange(mine, 0, -1) == [busy]
        assert not blocked_in_brpoplpush(r)  # it waits to be idle; it does not block
        assert r.get(keys.pill(jid_of(first))) is None

        held["busy"].set()
        wait_for(lambda: ran == ["busy", "suspect"])
        time.sleep(0.3)
        # Alone: nothing claimed beside it, though two threads are idle.
        assert ran == ["busy", "suspect"]
        assert rb.lrange(mine, 0, -1) == [first]
        assert rb.lrange("queue:rfs", 0, -1) == [normal, second]
    finally:
        for event in held.values():
            event.set()
    wait_for(lambda: ran == ["busy", "suspect", "other-suspect", "normal"])
    wait_for(lambda: not rb.exists(mine))
    assert not rb.exists(keys.SUSPECTS)  # each acknowledged run cleared its mark
    assert rb.llen("queue:rfs") == 0


# -- 5. batching ----------------------------------------------------------------------------


def test_claims_are_batched_and_every_job_runs_exactly_once(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    jobs = 200
    config.concurrency = 10
    config.queues = ["rfb"]
    config.poll_interval_average = 30.0  # keep the scheduler's scripts out of the count
    ran = redis.Redis(host="127.0.0.1", port=rb.connection_pool.connection_kwargs["port"])

    def record(n: int) -> None:
        ran.rpush("rf:ran", n)

    job = define(record)
    pipe = rb.pipeline(transaction=False)
    for n in range(jobs):
        pipe.lpush("queue:rfb", payload(job.name, n, queue="rfb"))
    pipe.execute()
    r.config_resetstat()
    t0 = time.monotonic()
    launcher = launch()
    try:
        wait_for(lambda: r.llen("rf:ran") >= jobs, timeout=15)
        elapsed = time.monotonic() - t0
        calls = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        wait_for(lambda: not rb.exists(wip(launcher.identity, "rfb")))  # every ack landed
    finally:
        launcher.stop()
        ran.close()
    done = [int(x) for x in r.lrange("rf:ran", 0, -1)]
    assert len(done) == jobs
    assert sorted(done) == list(range(jobs))  # no job twice, none lost
    assert r.llen("queue:rfb") == 0
    print(f"\n{jobs} jobs, {calls} EVALSHA round trips ({jobs / max(calls, 1):.2f} jobs each), "
          f"{elapsed:.2f}s")
    assert 0 < calls < jobs


def test_a_busy_process_holds_no_more_jobs_than_it_has_threads(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    """A claimed job that no thread runs is in no queue and no work hash:
    Sidekiq's API cannot see it and idle threads elsewhere cannot take it."""
    config.concurrency = 4
    config.queues = ["rfidle"]
    jobs = 80
    job = define(lambda n: time.sleep(0.01 * (n % 3)))
    pipe = rb.pipeline(transaction=False)
    for n in range(jobs):
        pipe.lpush("queue:rfidle", payload(job.name, n, queue="rfidle"))
    pipe.execute()
    launcher = launch()
    mine = wip(launcher.identity, "rfidle")
    held: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + 20
    while (rb.llen("queue:rfidle") or rb.exists(mine)) and time.monotonic() < deadline:
        held[rb.llen(mine)] += 1
    assert rb.llen("queue:rfidle") == 0 and not rb.exists(mine), "did not drain in 20 s"
    print(f"\nprivate-list length: samples per length {sorted(held.items())}")
    assert max(held) <= config.concurrency, sorted(held.items())
    assert held[config.concurrency] > 0  # the sampling saw a full process


# -- 6. paused queues and blocking ----------------------------------------------------------


def test_paused_queue_is_never_claimed_until_unpaused(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.queues = ["rfheld", "rffree"]
    ran: list[str] = []
    job = define(ran.append)
    r.sadd("paused", "rfheld")
    held = payload(job.name, "held", queue="rfheld")
    rb.lpush("queue:rfheld", held)
    for i in range(3):
        rb.lpush("queue:rffree", payload(job.name, f"free-{i}", queue="rffree"))
    launcher = launch()
    wait_for(lambda: len(ran) == 3)
    time.sleep(0.6)  # several claim and block rounds
    assert sorted(ran) == ["free-0", "free-1", "free-2"]  # and not "held"
    assert rb.lrange("queue:rfheld", 0, -1) == [held]
    assert not rb.exists(wip(launcher.identity, "rfheld"))
    r.srem("paused", "rfheld")
    wait_for(lambda: "held" in ran, timeout=3)
    assert rb.llen("queue:rfheld") == 0
    wait_for(lambda: not rb.exists(wip(launcher.identity, "rfheld")))


@pytest.mark.parametrize(("queues", "target", "bound"), [
    (["rfsolo"], "rfsolo", 0.5),
    (["rffirst", "rfsecond"], "rfsecond", 1.0),
])
def test_idle_fetcher_picks_up_a_new_job_quickly(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        queues: list[str], target: str, bound: float) -> None:
    # A long fetch timeout: only a blocking wait (or, with several queues, a
    # short poll) can make the latency bound.
    config.fetch_timeout = 2.0
    config.queues = queues
    config.concurrency = 2
    started: list[float] = []

    def stamp() -> None:
        started.append(time.time())

    job = define(stamp)
    launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    time.sleep(0.1)
    pushed = time.time()
    rb.lpush(f"queue:{target}", payload(job.name, queue=target))
    wait_for(lambda: started, timeout=3)
    latency = started[0] - pushed
    assert latency < bound, f"job started {latency:.3f}s after the push"


# -- 7. quiet -------------------------------------------------------------------------------


def test_quiet_gives_back_unstarted_jobs_and_claims_nothing_more(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    fetch = reliable(launcher)
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        # A claim that lands after every thread is busy (its thread gave up
        # waiting): the job is claimed but nobody starts it.
        unstarted = payload(job.name, "unstarted")
        rb.lpush("queue:default", unstarted)
        assert fetch._claim(1, []) == 1
        assert rb.lrange(mine, 0, -1) == [unstarted, running]
        assert rb.llen("queue:default") == 0

        launcher.quiet()
        assert rb.lrange("queue:default", 0, -1) == [unstarted]
        assert rb.lrange(mine, 0, -1) == [running]

        later = payload(job.name, "later")
        rb.lpush("queue:default", later)
        time.sleep(0.5)
        assert rb.lrange("queue:default", 0, -1) == [later, unstarted]
        assert rb.lrange(mine, 0, -1) == [running]
    finally:
        gate.release.set()
    # The running job finishes and is acknowledged even though we are quiet.
    wait_for(lambda: not rb.exists(mine))
    launcher.stop()
    assert gate.runs == ["running"]
    assert rb.lrange("queue:default", 0, -1) == [later, unstarted]
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    assert not r.exists(keys.wip_queues(launcher.identity))
    assert int(r.get("stat:processed") or 0) == 1


def test_quiet_while_blocked_leaves_new_jobs_in_the_queue(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    # The fetcher sits in a long BRPOPLPUSH for an idle thread when quiet
    # arrives; a job pushed then must stay in the queue, not wait in memory.
    config.concurrency = 1
    config.fetch_timeout = 2.0
    ran: list[str] = []
    job = define(ran.append)
    launcher = launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    launcher.quiet()
    raw = payload(job.name, "after-quiet")
    rb.lpush("queue:default", raw)
    wait_for(lambda: not blocked_in_brpoplpush(r), timeout=3)
    time.sleep(0.1)
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert not rb.exists(wip(launcher.identity, "default"))
    launcher.stop()
    assert ran == []
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)


# -- 8. hard stop ---------------------------------------------------------------------------


def test_hard_stop_requeues_the_running_job_and_drops_its_late_finish(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    config.shutdown_timeout = 0.5
    gate = Gate()
    job = define(gate.run)
    raw = payload(job.name, "long")
    pill = keys.pill(jid_of(raw))
    rb.set(pill, 1)
    rb.expire(pill, 3600)
    rb.lpush("queue:default", raw)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        assert rb.lrange(mine, 0, -1) == [raw]
        newer = payload(job.name, "newer")
        rb.lpush("queue:default", newer)
        t0 = time.monotonic()
        assert launcher.stop() == 1
        assert time.monotonic() - t0 < 2.0
        # Back at the fetch (oldest) end: it runs next.
        assert rb.lrange("queue:default", 0, -1) == [newer, raw]
        assert not rb.exists(mine)
        assert private_lists(rb, launcher.identity) == []
        assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    finally:
        gate.release.set()
    assert gate.finished.wait(3)
    wait_for(lambda: all(not t.is_alive() for t in launcher.manager._threads))
    time.sleep(0.1)
    # The late finish neither acknowledged (the pill is intact) nor counted.
    assert rb.get(pill) == b"1"
    assert launcher.manager.counters.take() == (0, 0)
    assert int(r.get("stat:processed") or 0) == 0
    assert rb.lrange("queue:default", 0, -1) == [newer, raw]
    assert gate.runs == ["long"]


def test_what_a_stop_leaves_in_the_private_list_goes_back_unblamed(
        r: redis.Redis, rb: redis.Redis, config: Config, launch: Launch) -> None:
    launcher = launch()
    mine = wip(launcher.identity, "default")
    left = payload("Left", "behind")  # say, a give-back that failed during the drain
    wait_for(lambda: blocked_in_brpoplpush(r))
    rb.lpush(mine, left)
    launcher.stop()
    assert rb.lrange("queue:default", 0, -1) == [left]
    # The process did not die: nothing to blame, nothing to suspect.
    assert r.get(keys.pill(jid_of(left))) is None
    assert not rb.exists(keys.SUSPECTS)
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)


# -- 9. resync ------------------------------------------------------------------------------


def test_resync_returns_strays_and_keeps_what_is_really_held(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        # A claim whose reply never arrived: in our list, unknown to us.
        stray = payload(job.name, "stray")
        rb.lpush(mine, stray)
        assert reliable(launcher).resync() == 1
        assert rb.lrange("queue:default", 0, -1) == [stray]
        assert rb.lrange(mine, 0, -1) == [running]
        assert reliable(launcher).resync() == 0
        assert rb.lrange(mine, 0, -1) == [running]
    finally:
        gate.release.set()
    # The stray was really given back: the freed thread now runs it.
    wait_for(lambda: gate.runs == ["running", "stray"])
    wait_for(lambda: not rb.exists(mine))
    assert rb.llen("queue:default") == 0



def quiet_background(config: Config, proxy: FaultProxy) -> None:
    """Only the fetcher talks to Redis through the proxy once the process has booted."""
    config.redis_url = proxy.url
    config.concurrency = 1
    config.heartbeat_interval = 30.0
    config.poll_interval_average = 30.0


def test_lost_claim_reply_is_resynced_and_the_job_runs_once(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    quiet_background(config, proxy)
    config.queues = ["rffirst", "rfsecond"]
    ran: list[str] = []
    job = define(ran.append)
    launcher = launch()
    time.sleep(0.3)  # the boot-time beat, sweep and scheduler poll are over
    # Blocked on the first queue; the next request through the proxy is the
    # claim that follows, which takes the job we now push to the second one.
    wait_for(lambda: blocked_in_brpoplpush(r))
    with capture_logs() as logs:
        proxy.drop_next_reply()
        rb.lpush("queue:rfsecond", payload(job.name, "lost-reply", queue="rfsecond"))
        # Without a resync the job would sit in the private list until stop.
        wait_for(lambda: ran, timeout=4)
        wait_for(lambda: not rb.exists(wip(launcher.identity, "rfsecond")))
    events = [e["event"] for e in logs]
    assert "fetch.error" in events  # the claim's reply really was the one lost
    assert {"event": "fetch.resynced", "jobs": 1, "log_level": "warning"} in logs
    time.sleep(0.3)
    assert ran == ["lost-reply"]
    assert rb.llen("queue:rfsecond") == 0
    launcher.stop()
    assert ran == ["lost-reply"]
    assert private_lists(rb, launcher.identity) == []


def test_a_disruption_the_pool_absorbed_in_another_thread_still_resyncs(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    """A promoted replica (or a restarted Redis) can lack an acknowledgement
    the old server took: the job is back in our private list, unknown to us.
    The only sign is a disruption somewhere in the pool, perhaps in a job's
    own call that the pool retried without anyone else seeing an error."""
    quiet_background(config, proxy)
    ran: list[str] = []

    def work(tag: str) -> None:
        if tag == "poke":
            # The fetcher is idle (the one thread is here), so this call is
            # the next request through the proxy: dropped, then retried.
            proxy.drop_next_request()
            assert pool_for(config).call("GET", "anything", idempotent=True) is None
        ran.append(tag)

    job = define(work)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    first = payload(job.name, "first")
    rb.lpush("queue:default", first)
    wait_for(lambda: ran == ["first"] and not rb.exists(mine))
    disruptions = pool_for(config).disruptions
    # The acknowledgement "lost": the job is back in our list. Nothing has
    # gone wrong in this process, so nothing looks.
    rb.lpush(mine, first)
    time.sleep(0.5)
    assert ran == ["first"] and rb.lrange(mine, 0, -1) == [first]

    with capture_logs() as logs:
        rb.lpush("queue:default", payload(job.name, "poke"))
        wait_for(lambda: ran[-1:] == ["first"] and len(ran) == 3, timeout=5)
    assert ran == ["first", "poke", "first"]
    assert pool_for(config).disruptions > disruptions
    assert not any(e["event"] == "fetch.error" for e in logs)  # the fetcher saw no error
    assert {"event": "fetch.resynced", "jobs": 1, "log_level": "warning"} in logs
    wait_for(lambda: not rb.exists(mine))
    assert rb.llen("queue:default") == 0


def test_quiet_and_stop_in_a_redis_outage_lose_nothing(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    quiet_background(config, proxy)
    config.redis_retry_attempts = 1
    config.shutdown_timeout = 0.3
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        unstarted = payload(job.name, "unstarted")
        rb.lpush("queue:default", unstarted)
        assert reliable(launcher)._claim(1, []) == 1  # claimed, nobody free to start it
        proxy.refuse()
        proxy.half_close()
        t0 = time.monotonic()
        launcher.quiet()  # cannot hand the unstarted job back, and must not blow up
        launcher.stop()
        assert time.monotonic() - t0 < 5.0
        assert launcher.stopped.is_set()
    finally:
        gate.release.set()
        proxy.heal()
    assert gate.finished.wait(3)
    # Nothing lost: both jobs wait in the private list for the reaper.
    assert sorted(rb.lrange(mine, 0, -1)) == sorted([running, unstarted])
    assert launcher.identity in r.smembers(keys.WIP_OWNERS)
    r.delete(launcher.identity, keys.REAPER_LOCK)  # its heartbeat lapses
    assert sweep(config) == 1
    assert sorted(rb.lrange("queue:default", 0, -1)) == sorted([running, unstarted])
    assert gate.runs == ["running"]


# -- 10. basic fetch ------------------------------------------------------------------------


def test_basic_fetch_still_works_without_private_lists(
        r: redis.Redis, config: Config, define: Define, launch: Launch) -> None:
    config.reliable_fetch = False
    done = threading.Event()
    job = define(done.set)
    job.perform_async()
    launcher = launch()
    assert done.wait(3)
    assert type(launcher.manager.fetch).__name__ == "BasicFetch"
    assert r.keys("wurk:*") == []
    launcher.stop()
    assert r.keys("wurk:*") == []
    assert int(r.get("stat:processed") or 0) == 1


def test_claim_ack_requeue_and_recover_move_jobs_at_maxmemory(
        own_redis: RedisServer, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    """Moves that do not grow memory must work when Redis refuses writes."""
    client = redis.Redis(host="127.0.0.1", port=own_redis.port)
    ran: list[int] = []
    gate = threading.Event()

    def work(n: int) -> None:
        ran.append(n)
        if n < 0:
            gate.wait(10)  # still running at stop: given back
    job = define(work)
    quick = [payload(job.name, n) for n in range(20)]
    held = payload(job.name, -1)
    client.lpush("queue:default", *quick, held)
    # A dead process's private list, for the recovery below.
    client.sadd(keys.WIP_OWNERS, "gone:1:000000000000")
    client.sadd(keys.wip_queues("gone:1:000000000000"), "other")
    client.lpush(wip("gone:1:000000000000", "other"), payload(job.name, 99, queue="other"))
    fill_to_maxmemory(client)
    config = Config(redis_url=own_redis.url, concurrency=2, fetch_timeout=0.2,
                    heartbeat_interval=0.2, shutdown_timeout=0.5, log_level="warning")
    try:
        launcher = launch_with(config)  # before: the first heartbeat raised OOM here
        wait_for(lambda: len(ran) == 21, what="every job claimed and started")
        wait_for(lambda: client.llen(wip(launcher.identity, "default")) == 1,
                 what="every finished job acknowledged")
        assert client.llen("queue:default") == 0
        launcher.stop(time.monotonic() + 0.5)
        assert client.lrange("queue:default", 0, -1) == [held]  # requeued at stop
        assert private_lists(client, launcher.identity) == []
        assert recover(config, "gone:1:000000000000") == (1, 0)
        assert client.llen("queue:other") == 1
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("still", "full")
    finally:
        gate.set()
        close_pool(config)
        client.close()

"""Attacks on cancelling a running job, as an outsider would make them: Redis
going away under the watch, a slow or cut link between a worker and Redis
while cancels are issued, a storm of cancels over jobs queued, running and
done, and ``--kill`` of a job stuck in C in a ``wurk run --max-jobs`` process.

Whatever happens, each job ends once: done, or cancelled; never both, never
lost, never in the retry or dead set. Real redis-servers, real launchers and
real ``wurk run`` processes; the faults are a stopped server and
tests/faultproxy.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
from cli_workers import Worker
from conftest import RedisServer, start_redis
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.api import JobNotFoundError, cancel
from wurk.push.client import Client
from wurk.redis.runtime import close_runtime
from wurk.results.client import wait
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire import keys

pytestmark = pytest.mark.timeout(120)
spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
Logs = list[dict[str, Any]]


def push(config: Config, name: str, n: int, **extra: Any) -> str:
    jid = Client(config).push({"class": name, "args": [n], "result_ttl": 120, **extra})
    assert jid is not None
    return jid


def running_here(config: Config, jid: str) -> bool:
    return any(w.payload.get("jid") == jid for _, _, w in wurk.api.Workers(config=config))


def events(logs: Logs, name: str) -> list[str]:
    return [e["jid"] for e in logs if e["event"] == name]


def settled_once(r: redis.Redis, jids: list[str], cancelled: list[str],
                 asked: set[str]) -> None:
    """Every jid ended exactly once: done (the job's own record) or cancelled."""
    done = r.lrange("done", 0, -1)
    assert len(done) == len(set(done)), "a job ran to its end twice"
    assert len(cancelled) == len(set(cancelled)), "a job was cancelled twice"
    assert not set(done) & set(cancelled), "a job both done and cancelled"
    assert set(done) | set(cancelled) == set(jids), "a job neither done nor cancelled"
    assert set(cancelled) <= asked, "a job cancelled that nobody cancelled"
    assert set(r.lrange("saw", 0, -1)) <= asked, "JobCancelled in a job nobody cancelled"
    assert r.zcard(keys.RETRY) == 0 and r.zcard(keys.DEAD) == 0
    assert r.llen("queue:default") == 0


# -- 1. Redis goes away under the watch -------------------------------------------


def test_the_watch_rides_out_a_redis_outage_and_cancels_after_it(
        own_redis: RedisServer, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    cfg = Config(redis_url=own_redis.url, heartbeat_interval=0.2, poll_interval_average=0.1,
                 fetch_timeout=0.2, shutdown_timeout=2.0, log_level="warning",
                 redis_retry_attempts=1, redis_retry_base=0.0, redis_retry_cap=0.2)
    wurk.configure(cfg)
    started, saw = threading.Event(), []

    def looping(n: int) -> None:
        started.set()
        try:
            for _ in range(2400):  # two minutes, one short C call at a time
                time.sleep(0.05)
        except wurk.JobCancelled:
            saw.append(n)
            raise

    job = define(looping)
    restarted: list[RedisServer] = []
    try:
        with capture_logs() as logs:
            launcher = launch_with(cfg)
            jid = push(cfg, job.name, 1)
            assert started.wait(EVENTUALLY)
            wait_for(lambda: running_here(cfg, jid), what="the job in its process's work")
            watch = launcher.cancel_watch.service
            own_redis.stop()
            down = time.monotonic()
            # One attempt a read, no backoff: nothing but the watch's own pause
            # keeps a failing read from being tried again at once.
            wait_for(lambda: failed(logs) >= 3, what="the watch's reads failing")
            failed_reads, outage = failed(logs), time.monotonic() - down
            restarted.append(start_redis(port=own_redis.port))
            assert failed_reads <= 2 + 2 * outage / launcher.cancel_watch.poll
            assert watch.alive()
            # The restarted server is empty: cancel once the heartbeat shows the job again.
            wait_for(lambda: running_here(cfg, jid), ignoring=(redis.ConnectionError,),
                     what="the job in its heartbeat after the outage")
            assert cancel(jid, config=cfg).state == "running"
            wait_for(lambda: events(logs, "job.cancelled"), what="job.cancelled")
        assert events(logs, "job.cancelled") == [jid] and saw == [1]
        assert watch.alive()
        assert not [e for e in logs if e["event"] in ("job.retry", "job.dead", "job.fail")]
    finally:
        close_runtime(cfg)
        for server in restarted:
            server.stop()


def failed(logs: Logs) -> int:
    return sum(e["event"] == "cancel.watch_failed" for e in logs)


def test_the_cli_cancel_says_one_line_while_redis_is_down(own_redis: RedisServer,
                                                         tmp_path: Path) -> None:
    url = own_redis.url
    own_redis.stop()
    done = subprocess.run(
        [sys.executable, "-m", "wurk.cli", "--redis-url", url, "cancel", "0" * 24],
        check=False, capture_output=True, text=True, timeout=EVENTUALLY * 3, cwd=tmp_path,
        env=cli_workers.child_env(url, tmp_path))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wurk: "), done.stderr


# -- 1b. a job that began since its process's last heartbeat --------------------------


def test_a_job_started_since_the_last_heartbeat_is_found_running(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    """At the default heartbeat (5 s) the work hash lags a job's start by seconds;
    cancel must not say "no job" of a job it is about to stop."""
    started = threading.Event()

    def looping(n: int) -> None:
        started.set()
        for _ in range(1200):
            time.sleep(0.05)

    job = define(looping)
    slow_beat = dataclasses.replace(config, heartbeat_interval=5.0)
    with capture_logs() as logs:
        launcher = launch_with(slow_beat)
        wait_for(lambda: r.sismember("processes", launcher.identity), what="the first beat")
        jid = push(config, job.name, 1)
        assert started.wait(EVENTUALLY)
        found = cancel(jid, config=config)
        wait_for(lambda: events(logs, "job.cancelled"), what="job.cancelled")
    assert (found.state, found.where) == ("running", launcher.identity)
    assert events(logs, "job.cancelled") == [jid]


def test_kill_after_a_plain_cancel_still_takes_a_job_stuck_in_c(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    """A person cancels, sees the job go on (stuck in C), then cancels with --kill."""
    release = threading.Event()

    def stuck(n: int) -> None:
        r.rpush("started", n)
        release.wait(120)  # one C-level wait: no exception lands inside it

    job = define(stuck)
    launcher = launch_with(dataclasses.replace(config, shutdown_timeout=1.0))
    try:
        with capture_logs() as logs:
            jid = push(config, job.name, 1)
            wait_for(lambda: r.llen("started"), what="the job started")
            wait_for(lambda: running_here(config, jid), what="the job in its work")
            assert cancel(jid, config=config).state == "running"
            wait_for(lambda: events(logs, "job.cancelling"), what="the plain cancel fired")
            assert cancel(jid, kill=True, config=config).state == "running"
            wait_for(lambda: events(logs, "job.cancelled"), what="the job settled by the kill")
            wait_for(launcher.stopped.is_set, what="the process recycled")
        assert events(logs, "job.cancelled") == [jid]
        assert [e["reason"] for e in logs if e["event"] == "launcher.recycling"] == [
            "cancel_kill"]
        assert r.llen("queue:default") == 0 and r.zcard(keys.RETRY) == 0
    finally:
        release.set()


# -- 2. a slow, then cut, link between the worker and Redis ------------------------


def test_cancels_across_a_slow_and_cut_link_end_each_job_once(
        config: Config, r: redis.Redis, proxy: FaultProxy, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    """The worker reaches Redis through the proxy; the cancels go straight to Redis."""
    def paced(n: int) -> None:
        try:
            for _ in range(30):
                time.sleep(0.05)
            r.rpush("done", str(n))
        except wurk.JobCancelled:
            r.rpush("saw", str(n))
            raise

    job = define(paced)
    behind = dataclasses.replace(config, redis_url=proxy.url, concurrency=4,
                                 redis_retry_base=0.05, redis_retry_cap=0.2)
    jids = {str(n): push(config, job.name, n) for n in range(12)}
    of = {jid: n for n, jid in jids.items()}
    asked: dict[str, str] = {}

    def cancel_some(ns: list[int]) -> None:
        for n in ns:
            try:
                asked[str(n)] = cancel(jids[str(n)], config=config).state
            except JobNotFoundError:
                asked[str(n)] = "nowhere"

    try:
        with capture_logs() as logs:
            launch_with(behind)
            wait_for(lambda: r.llen("queue:default") <= 8, what="the first four taken")
            proxy.delay(0.3)  # slow: every reply to the worker late
            cancel_some([0, 1, 2])
            wait_for(lambda: len(events(logs, "job.cancelling")) >= 1, what="a cancel read late")
            proxy.heal()
            # The next ones running, as the heartbeat shows them (what cancel looks for).
            wait_for(lambda: running_here(config, jids["4"]) and running_here(config, jids["5"]),
                     what="the next jobs running")
            proxy.drop_next_request()  # whichever part asks next: its request lost
            proxy.drop_next_reply()  # and the next one's reply
            proxy.half_close()
            proxy.refuse()  # cut: no new connection either
            cancel_some([4, 5, 9, 11])
            wait_for(lambda: [e for e in logs if e["event"] == "cancel.watch_failed"],
                     what="the watch's read failing across the cut")
            proxy.heal()

            def ended() -> bool:
                removed = sum(said == "queued" for said in asked.values())
                return r.llen("done") + len(events(logs, "job.cancelled")) + removed >= 12

            wait_for(ended, 60, what="every job ended")
            wait_for(lambda: r.llen("queue:default") == 0 and not running_on(config),
                     what="nothing left to run")
        removed = [n for n, said in asked.items() if said == "queued"]
        cancelled = [of[jid] for jid in events(logs, "job.cancelled")] + removed
        settled_once(r, list(jids), cancelled, set(asked))
        assert not [e for e in logs if e["event"] in ("job.retry", "job.dead", "job.fail")]
    finally:
        proxy.heal()
        close_runtime(behind)


def running_on(config: Config) -> bool:
    return any(True for _ in wurk.api.Workers(config=config))


# -- 3. a storm of cancels over jobs queued, running and done ------------------------

STORM = 200


class Storm:
    """A thread cancelling random jobs of the storm while they run, and what each cancel said."""

    def __init__(self, config: Config, jids: dict[str, str]) -> None:
        self.config, self.jids = config, jids
        self.asked: dict[str, str] = {}  # n -> what cancel said
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="test-storm")

    def run(self) -> None:
        rng = random.Random()
        try:
            while not self.stop.wait(rng.uniform(0.0, 0.08)) and len(self.asked) < STORM // 2:
                self.one(rng)
        except BaseException as error:  # noqa: BLE001 - the test says it
            self.errors.append(error)

    def one(self, rng: random.Random) -> None:
        """A running job, else any: one waiting, one done, one between the two."""
        running = [w.payload["jid"] for _, _, w in wurk.api.Workers(config=self.config)]
        ns = {jid: n for n, jid in self.jids.items()}
        if running and rng.random() < 0.6:
            n = ns.get(rng.choice(running))
        else:
            n = str(rng.randrange(len(self.jids)))
        if n is None or n in self.asked:
            return
        try:
            said = cancel(self.jids[n], config=self.config).state
        except JobNotFoundError:
            said = "nowhere"  # done, or fetched and not yet in its work hash
        self.asked[n] = said


def laps(n: int) -> int:
    # Most are short; one in ten runs long enough for the watch to find it.
    return 100 if n % 10 == 0 else 8


@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_storm_of_cancels_ends_each_job_once(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch_with: Callable[..., Launcher], executor: str) -> None:
    def brief(n: int) -> None:
        try:
            for _ in range(laps(n)):
                time.sleep(0.01)
            r.rpush("done", str(n))
        except wurk.JobCancelled:
            r.rpush("saw", str(n))
            raise

    async def abrief(n: int) -> None:
        try:
            for _ in range(laps(n)):
                await asyncio.sleep(0.01)
            r.rpush("done", str(n))
        except asyncio.CancelledError:
            r.rpush("saw", str(n))
            raise

    job = define(brief if executor == "threads" else abrief)
    with capture_logs() as logs:
        jids = {str(n): push(config, job.name, n) for n in range(STORM)}
        of = {jid: n for n, jid in jids.items()}
        storm = Storm(config, jids)
        storm.thread.start()
        launcher = launch_with(dataclasses.replace(config, concurrency=5, executor=executor))

        def settled() -> bool:
            ended = r.llen("done") + len(events(logs, "job.cancelled"))
            removed = sum(said == "queued" for said in storm.asked.values())
            return ended + removed >= STORM and not storm.thread.is_alive()

        try:
            wait_for(settled, 60, what="every job of the storm ended")
        finally:
            storm.stop.set()
            storm.thread.join()
        wait_for(lambda: not launcher.manager.cancels.running_jids(), what="nothing running")
    assert not storm.errors
    removed = [n for n, said in storm.asked.items() if said == "queued"]
    cancelled = [of[jid] for jid in events(logs, "job.cancelled")] + removed
    outcomes = {n: wait(jid, 5, config=config) for n, jid in jids.items()}
    # A cancel at a job's very last bytecode (its record written, JobCancelled landing
    # before it returns) ends it cancelled, as documented: the job saw it, and its
    # outcome says so; any other record of a cancelled job is a second ending.
    tail = {n for n in r.lrange("saw", 0, -1) if n in r.lrange("done", 0, -1)}
    for n in tail:
        r.lrem("done", 1, n)
    settled_once(r, list(jids), cancelled, set(storm.asked))
    assert {n for n, o in outcomes.items() if o.succeeded} == set(r.lrange("done", 0, -1))
    for n in cancelled:
        assert (outcomes[n].error_class, outcomes[n].final) == ("JobCancelled", True), n
    assert not [e for e in logs if e["event"] in ("job.retry", "job.dead", "job.fail")]


# -- 4. --kill of a job stuck in C, in a wurk run --max-jobs process -------------------

ATTACK_JOBS = '''
import os
import select
import time

import redis

import wurk

_r = redis.Redis.from_url(os.environ["REDIS_URL"])


@wurk.job(name="atk_echo")
def echo(n):
    _r.rpush("done", str(n))


@wurk.job(name="atk_hold")
def hold(n):
    # Runs while the test holds it: given back by the recycle, done by the next process.
    _r.rpush("atk:started", str(n))
    while _r.exists("atk:hold"):
        time.sleep(0.05)
    _r.rpush("done", str(n))


@wurk.job(name="atk_stuck")
def stuck(n):
    _r.rpush("atk:started", str(n))
    select.select([], [], [], 90)  # one C call: no exception lands inside it
    _r.rpush("done", str(n))


@wurk.job(name="atk_astuck")
async def astuck(n):
    _r.rpush("atk:started", str(n))
    select.select([], [], [], 90)  # blocks its event loop: no cancel reaches the task
    _r.rpush("done", str(n))
'''


@pytest.fixture
def attack_jobs(jobs_dir: Path) -> Iterator[None]:
    (jobs_dir / "attackjobs.py").write_text(ATTACK_JOBS)
    yield


def raw_push(r: redis.Redis, cls: str, n: int) -> str:
    jid, _ = cli_workers.push(r, cls, n)
    return jid


def in_queue(r: redis.Redis) -> list[str]:
    return sorted(json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1))


@pytest.mark.usefixtures("attack_jobs")
@pytest.mark.parametrize("max_jobs", [2, 50])
def test_kill_of_a_job_stuck_in_c_recycles_a_max_jobs_process(
        config: Config, r: redis.Redis, spawn: Callable[..., Worker], max_jobs: int) -> None:
    args = ("-r", "attackjobs", "-c", "4", "--log-level", "info")
    # With 2, the killed job is its second: its settling also spends the last one.
    first = spawn(*args, "--max-jobs", str(max_jobs), WURK_SHUTDOWN_TIMEOUT="1")
    raw_push(r, "atk_echo", 0)
    wait_for(lambda: r.lrange("done", 0, -1) == ["0"], 60, what="the first job done")
    r.set("atk:hold", "1")
    held = sorted(raw_push(r, "atk_hold", n) for n in (1, 2))
    stuck = raw_push(r, "atk_stuck", 3)
    wait_for(lambda: r.llen("atk:started") == 3, what="the three jobs started")
    wait_for(lambda: running_here(config, stuck), what="the stuck job in its work")
    assert cancel(stuck, kill=True, config=config).state == "running"
    assert first.wait(EVENTUALLY * 2) == 75, first.stderr()
    logged = first.events()
    assert [e["jid"] for e in logged if e.get("event") == "job.cancelled"] == [stuck]
    reasons = [e["reason"] for e in logged if e.get("event") == "launcher.recycling"]
    # Only the first request to recycle stops (Launcher.recycle), but the kill is
    # said either way: an operator looks for why a job was taken (exit 75).
    assert reasons == ["cancel_kill"] if max_jobs == 50 else reasons in (
        ["cancel_kill"], ["max_jobs", "cancel_kill"])
    # The others went back as the process stopped; the killed one did not.
    assert in_queue(r) == held
    assert r.zcard(keys.RETRY) == 0 and r.zcard(keys.DEAD) == 0
    r.delete("atk:hold")
    second = spawn(*args)
    wait_for(lambda: sorted(r.lrange("done", 0, -1)) == ["0", "1", "2"], 60,
             what="the given-back jobs done by the next process")
    second.send(15)
    assert second.wait(EVENTUALLY) == 0
    assert r.llen("queue:default") == 0 and r.zcard(keys.RETRY) == 0
    assert not [e for e in first.events() + second.events()
                if e.get("event") in ("job.retry", "job.dead", "job.fail")]


@pytest.mark.usefixtures("attack_jobs")
def test_kill_of_an_async_job_blocking_its_loop_recycles_the_process(
        config: Config, r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "attackjobs", "--log-level", "info", WURK_EXECUTOR="asyncio",
                   WURK_SHUTDOWN_TIMEOUT="1")
    stuck = raw_push(r, "atk_astuck", 1)
    wait_for(lambda: r.llen("atk:started"), 60, what="the job started")
    wait_for(lambda: running_here(config, stuck), what="the stuck job in its work")
    assert cancel(stuck, kill=True, config=config).state == "running"
    assert worker.wait(EVENTUALLY * 2) == 75, worker.stderr()
    assert [e["jid"] for e in worker.events() if e.get("event") == "job.cancelled"] == [stuck]
    assert r.llen("queue:default") == 0 and r.zcard(keys.RETRY) == 0
    assert r.zcard(keys.DEAD) == 0 and r.llen("done") == 0

"""Redis lost its data while jobs ran (issue 25, item 4): their outcomes are still written.

A redis-server of the test's own restarted without persistence (or flushed)
while real in-process Launchers hold jobs, threads and asyncio executors:
failures still land in ``retry`` or ``dead``, a success writes nothing, and
the process registers again (heartbeat, private-list owner) so the reaper
can do its work. The counter-case: a copy a reaper recovered (the epoch
intact) is not written twice. Then SETTLE's replay safety, the epoch script
and the reaper's grace after a loss, one by one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import swarms
from conftest import RedisServer, start_redis
from fetching import fake_dead_owner
from structlog.testing import capture_logs
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime import settle
from wurk.runtime.epoch import Epoch
from wurk.runtime.launcher import Launcher
from wurk.runtime.reaper import recover, sweep
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.runtime.work import Settlement
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import dumps, new_jid

pytestmark = pytest.mark.timeout(90)
launch = swarms.launch
Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


@pytest.fixture
def own_config(own_redis: RedisServer) -> Iterator[Config]:
    cfg = Config(redis_url=own_redis.url, heartbeat_interval=0.2, poll_interval_average=0.1,
                 fetch_timeout=0.2, shutdown_timeout=2.0, log_level="warning", concurrency=5)
    wurk.configure(cfg)
    wurk.Client._default = None
    yield cfg
    close_runtime(cfg)


def lose_data(server: RedisServer, how: str) -> None:
    """Restart on the same port without persistence, or FLUSHALL."""
    if how == "flushall":
        with server.client() as client:
            client.flushall()
        return
    server.stop()
    again = start_redis(port=server.port)
    shutil.rmtree(server.workdir, ignore_errors=True)
    server.proc, server.workdir = again.proc, again.workdir


class Gate:
    """Jobs that start, say so, and wait until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.started: list[str] = []

    def job(self, fail: bool, coroutine: bool) -> Callable[[str], Any]:
        def run(tag: str) -> None:
            self.started.append(tag)
            assert self.open.wait(60)
            if fail:
                raise RuntimeError(f"{tag} failed after the data loss")

        async def run_async(tag: str) -> None:
            self.started.append(tag)
            while not self.open.is_set():
                await asyncio.sleep(0.01)
            if fail:
                raise RuntimeError(f"{tag} failed after the data loss")

        return run_async if coroutine else run


def jids_in(client: redis.Redis, key: str) -> list[str]:
    return [json.loads(member)["jid"] for member in client.zrange(key, 0, -1)]


@pytest.mark.parametrize("how", ["restart", "flushall"])
@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_jobs_held_when_redis_loses_its_data_still_settle(
        own_redis: RedisServer, own_config: Config, launch_with: Launch, define: Define,
        executor: str, how: str) -> None:
    own_config = tuned(own_config, executor=executor)
    coroutine = executor == "asyncio"
    gate = Gate()
    failing = define(gate.job(fail=True, coroutine=coroutine))
    dying = define(gate.job(fail=True, coroutine=coroutine), retry=0)
    fine = define(gate.job(fail=False, coroutine=coroutine))
    client = own_redis.client()
    launcher = launch_with(own_config)
    fetch = launcher.manager.fetch
    assert isinstance(fetch, ReliableFetch)
    before = wait_for(lambda: fetch.epoch.current, what="the epoch learned at boot")
    retried = [failing.perform_async(f"retry-{i}") for i in range(3)]
    dead = dying.perform_async("dead")
    succeeded = fine.perform_async("fine")
    wait_for(lambda: len(gate.started) == 5, what="5 jobs running")
    with capture_logs() as logs:
        lose_data(own_redis, how)
        gate.open.set()
        # Before: the copies were gone, so every settle wrote nothing.
        wait_for(lambda: client.zcard("retry") == 3 and client.zcard("dead") == 1,
                 what="3 retries and 1 dead entry", ignoring=REDIS_DOWN)
        wait_for(lambda: launcher.manager.in_flight.busy() == 0, what="every job settled")
    assert sorted(jids_in(client, "retry")) == sorted(retried)
    assert jids_in(client, "dead") == [dead]
    events = [e["event"] for e in logs]
    assert events.count("job.settled_after_data_loss") == 4
    assert "job.settle_skipped" not in events
    assert succeeded not in jids_in(client, "retry") + jids_in(client, "dead")
    assert len(list(client.scan_iter(match=f"{keys.SETTLED_PREFIX}*"))) == 4
    # The process is back as Sidekiq and the reaper see it, under a new epoch.
    wait_for(lambda: fetch.epoch.current not in ("", before), what="the new epoch learned")
    assert client.get(keys.EPOCH) == fetch.epoch.current
    wait_for(lambda: client.hexists(launcher.identity, "beat")
             and launcher.identity in client.smembers("processes"), what="the heartbeat back")
    # Before: the owner came back only with a claim, never with a blocking move.
    wait_for(lambda: launcher.identity in client.smembers(keys.WIP_OWNERS),
             what="the private lists owned again")
    gate.started.clear()
    gate.open.clear()
    again = failing.perform_async("after")
    wait_for(lambda: gate.started == ["after"], what="a job run after the loss")
    assert client.llen(keys.wip(launcher.identity, "default")) == 1
    gate.open.set()
    wait_for(lambda: again in jids_in(client, "retry"), what="its retry entry")


@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_copy_a_reaper_recovered_is_not_written_again(
        own_redis: RedisServer, own_config: Config, launch_with: Launch, define: Define,
        executor: str) -> None:
    own_config = tuned(own_config, executor=executor, concurrency=1)
    gate = Gate()
    failing = define(gate.job(fail=True, coroutine=executor == "asyncio"))
    client = own_redis.client()
    launcher = launch_with(own_config)
    fetch = launcher.manager.fetch
    assert isinstance(fetch, ReliableFetch)
    wait_for(lambda: fetch.epoch.current, what="the epoch learned at boot")
    jid = failing.perform_async("recovered")
    wait_for(lambda: gate.started == ["recovered"], what="the job running")
    # As if we had looked dead (a partition longer than the heartbeat): the
    # copy goes back to its queue, and another process takes it (our one
    # thread is busy, so we claim nothing meanwhile).
    assert recover(runtime_for(own_config), launcher.identity) == (1, 0)
    taken = client.rpop("queue:default")
    assert taken is not None and json.loads(taken)["jid"] == jid
    gate.open.set()
    wait_for(lambda: launcher.manager.in_flight.busy() == 0, what="the failure settled")
    assert client.zcard("retry") == 0  # the recovered copy's run writes its own
    assert not list(client.scan_iter(match=f"{keys.SETTLED_PREFIX}*"))


def test_basic_fetch_writes_the_entry_after_a_loss_as_before(
        own_redis: RedisServer, own_config: Config, launch_with: Launch,
        define: Define) -> None:
    own_config = tuned(own_config, reliable_fetch=False)
    gate = Gate()
    failing = define(gate.job(fail=True, coroutine=False))
    client = own_redis.client()
    launch_with(own_config)
    jids = [failing.perform_async(f"basic-{i}") for i in range(3)]
    wait_for(lambda: len(gate.started) == 3, what="3 jobs running")
    lose_data(own_redis, "restart")
    gate.open.set()
    wait_for(lambda: client.zcard("retry") == 3, what="3 retries", ignoring=REDIS_DOWN)
    assert sorted(jids_in(client, "retry")) == sorted(jids)
    assert not client.exists(keys.EPOCH)  # basic fetch needs no epoch


def _retry(jid: str) -> Settlement:
    return Settlement("retry", dumps({"class": "X", "args": [], "jid": jid, "retry_count": 0}),
                      1_900_000_000.0)


def test_a_settle_after_a_loss_writes_once_even_when_replayed(
        config: Config, r: redis.Redis) -> None:
    private = keys.wip("host:1:abc", "default")
    settlement = _retry("j1")
    # The copy and the epoch it was claimed under are both gone.
    assert settle.write(runtime_for(config), settlement, private, b"raw", "", epoch="aaaa")
    assert r.zcard("retry") == 1
    r.zremrangebyrank("retry", 0, -1)  # promoted and run meanwhile
    assert not settle.write(runtime_for(config), settlement, private, b"raw", "", epoch="aaaa")
    assert r.zcard("retry") == 0
    # A second failure of the same job is another settlement: written.
    assert settle.write(runtime_for(config), _retry("j1-again"), private, b"raw", "", epoch="aaaa")
    assert r.zcard("retry") == 1


def test_a_missing_copy_under_an_intact_epoch_writes_nothing(
        config: Config, r: redis.Redis) -> None:
    r.set(keys.EPOCH, "aaaa")
    private = keys.wip("host:1:abc", "default")
    assert not settle.write(runtime_for(config), _retry("j1"), private, b"raw", "", epoch="aaaa")
    # The epoch unknown: as before.
    assert not settle.write(runtime_for(config), _retry("j1"), private, b"raw", "")
    assert r.zcard("retry") == 0
    # A different epoch, or a key no one could have set, is a loss.
    for value in ("bbbb", None):
        r.delete(keys.EPOCH)
        if value:
            r.set(keys.EPOCH, value)
        r.delete(*r.keys(f"{keys.SETTLED_PREFIX}*") or ["-"])
        r.delete("retry")
        assert settle.write(runtime_for(config), _retry("j1"), private, b"raw", "", epoch="aaaa")
        assert r.zcard("retry") == 1


def test_the_epoch_is_set_once_adopted_by_all_and_garbage_replaced(
        config: Config, r: redis.Redis) -> None:
    first, second = Epoch(config), Epoch(config)
    token = first.refresh()
    assert token and second.refresh() == token == r.get(keys.EPOCH)
    assert r.ttl(keys.EPOCH) == -1  # it never expires
    assert not r.exists(keys.REAPER_LOCK)  # first learning: no loss, no grace
    lost: list[str] = []
    second.on_lost(lambda: lost.append("second"))
    r.delete(keys.EPOCH)
    r.hset(keys.EPOCH, "not", "a string")
    renewed = second.refresh()
    assert renewed not in ("", token) and r.get(keys.EPOCH) == renewed
    assert lost == ["second"]
    assert 0 < r.ttl(keys.REAPER_LOCK) <= keys.HEARTBEAT_TTL
    assert first.refresh() == renewed


def test_after_a_loss_the_reaper_waits_for_live_processes_to_beat(
        config: Config, r: redis.Redis, rb: redis.Redis) -> None:
    epoch = Epoch(config)
    epoch.refresh()
    r.flushall()
    # A live process whose heartbeat went with the data, its new claim owned again.
    fake_dead_owner(rb, "live:1:abc", "default", b'{"jid":"x"}')
    assert sweep(runtime_for(config), "me", epoch) == 0
    assert rb.llen(keys.wip("live:1:abc", "default")) == 1
    # Once the grace is over (the lock gone), an owner still silent is recovered.
    r.delete(keys.REAPER_LOCK)
    assert sweep(runtime_for(config), "me", epoch) == 1


GATED_JOBS = swarms.PER_PID_REDIS + textwrap.dedent("""
    import time

    import redis as redis_module
    import wurk


    @wurk.job(name="gated_fail")
    def gated_fail(tag):
        r().rpush("started", tag)
        while True:
            try:
                if r().exists("gate"):
                    break
            except redis_module.RedisError:
                pass  # Redis is restarting: try again
            time.sleep(0.05)
        raise RuntimeError(f"{tag} failed after the data loss")


    @wurk.job(name="record")
    def record(tag):
        r().rpush("done", tag)
""")


def push_retried(client: redis.Redis, cls: str, tag: str) -> str:
    jid = new_jid()
    client.lpush("queue:default", json.dumps({
        "class": cls, "args": [tag], "queue": "default", "jid": jid, "retry": True,
        "created_at": time.time(), "enqueued_at": time.time()}))
    return jid


def test_a_swarm_whose_redis_restarts_empty_retries_what_it_held(
        tmp_path: Path, own_redis: RedisServer, launch: swarms.Launch) -> None:
    (tmp_path / "swarm_jobs.py").write_text(GATED_JOBS, encoding="utf-8")
    env = {"REDIS_URL": own_redis.url, "TEST_REDIS_URL": own_redis.url}
    swarm = launch(swarms.slot("alpha", count=2, concurrency=2, queues=["default"]),
                   env=env, redis_url=own_redis.url, layout={"alpha": 2})
    client = own_redis.client()
    swarm.r = client
    swarm.wait_ready()
    jids = [push_retried(client, "gated_fail", f"held-{i}") for i in range(4)]
    wait_for(lambda: client.llen("started") == 4, what="4 jobs running on 2 children")
    lose_data(own_redis, "restart")
    client = swarm.r = own_redis.client()
    client.set("gate", 1)
    # Before: 0 of the 4 reached the retry set.
    wait_for(lambda: client.zcard("retry") == 4, what="4 retry entries", ignoring=REDIS_DOWN)
    assert sorted(jids_in(client, "retry")) == sorted(jids)
    swarm.wait_events("redis.data_lost", count=2)  # each child saw it
    swarm.wait_ready(timeout=30)
    push_retried(client, "record", "after")
    wait_for(lambda: client.lrange("done", 0, -1) == ["after"], what="a job after the loss")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

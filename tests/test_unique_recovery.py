"""A unique job whose worker is SIGKILLed mid-job: its lock does not block the
job for ever. Reliable fetch's recovery gives the job back still holding its
lock, so the recovered job runs and then releases it; left alone, the lock
expires after ``unique_for``. Real ``wurk run`` subprocesses, real Redis."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import swarms
from cli_workers import Worker
from conftest import RedisServer
from swarms import slot
from waiting import EVENTUALLY, wait_for

from wurk.push.client import Client
from wurk.redis.runtime import runtime_for
from wurk.runtime.reaper import recover
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire import keys

REPO = Path(__file__).resolve().parent.parent
launch = swarms.launch

JOBS_MODULE = textwrap.dedent("""
    import os
    import time

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job(name="u_hang")
    def hang(tag):
        _r.rpush("u:started", tag)
        deadline = time.monotonic() + 30
        while _r.exists("u:hang") and time.monotonic() < deadline:
            time.sleep(0.05)
        _r.rpush("u:ran", tag)
""")


@pytest.fixture
def spawn(redis_server: RedisServer, r: redis.Redis,
          tmp_path: Path) -> Iterator[Callable[[], Worker]]:
    (tmp_path / "ujobs.py").write_text(JOBS_MODULE)
    workers: list[Worker] = []

    def start() -> Worker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
        env.pop("DYNO", None)
        env.update({"REDIS_URL": redis_server.url,
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
                    "WURK_HEARTBEAT_INTERVAL": "0.2", "WURK_FETCH_TIMEOUT": "0.5",
                    "PYTHONUNBUFFERED": "1"})
        worker = Worker(["-r", "ujobs", "-q", "uq", "-c", "2"], env, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def push(client: Client, tag: str, unique_for: float) -> str | None:
    return client.push({"class": "u_hang", "args": [tag], "queue": "uq",
                        "unique_for": unique_for})


def kill_mid_job(r: redis.Redis, worker: Worker, started: int) -> str:
    wait_for(lambda: r.llen("u:started") == started or not worker.alive(), timeout=15)
    assert worker.alive(), worker.stderr()
    (identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    worker.proc.send_signal(signal.SIGKILL)
    assert worker.proc.wait(EVENTUALLY) == -signal.SIGKILL
    return identity


def test_recovery_keeps_the_lock_and_the_recovered_job_releases_it(
        r: redis.Redis, config: Config, spawn: Callable[[], Worker]) -> None:
    client = Client(config)
    r.set("u:hang", 1)
    jid = push(client, "a", unique_for=60)
    assert jid is not None
    identity = kill_mid_job(r, spawn(), started=1)
    key = lock_key("u_hang", "uq", ["a"])
    assert r.get(key) == jid and r.pttl(key) > 50_000
    assert push(client, "a", unique_for=60) is None  # the killed job still holds it

    recover(runtime_for(config), identity)  # what the reaper or the swarm parent does
    assert r.get(key) == jid  # given back to its queue, still holding its lock
    assert push(client, "a", unique_for=60) is None
    r.delete("u:hang")
    second = spawn()
    wait_for(lambda: r.lrange("u:ran", 0, -1) == ["a"] or not second.alive(), timeout=15)
    assert second.alive(), second.stderr()
    wait_for(lambda: not r.exists(key))  # released by the recovered run
    assert push(client, "a", unique_for=60) is not None


def test_without_recovery_the_lock_expires_after_unique_for(
        r: redis.Redis, config: Config, spawn: Callable[[], Worker]) -> None:
    client = Client(config)
    r.set("u:hang", 1)
    worker = spawn()
    wait_for(lambda: r.scard("processes") == 1 or not worker.alive(), timeout=15)
    jid = push(client, "b", unique_for=4)  # the worker is up: the job starts at once
    identity = kill_mid_job(r, worker, started=1)
    key = lock_key("u_hang", "uq", ["b"])
    assert r.get(key) == jid
    assert push(client, "b", unique_for=4) is None
    wait_for(lambda: not r.exists(key), timeout=10)
    assert push(client, "b", unique_for=4) is not None  # free again
    r.set(key, "a-later-duplicates-jid", ex=30)  # that push's lock, its job elsewhere
    # The killed job comes back late: it runs, and leaves the new holder's lock alone.
    recover(runtime_for(config), identity)
    r.delete("u:hang")
    second = spawn()
    wait_for(lambda: r.llen("u:ran") == 2 or not second.alive(), timeout=15)
    assert second.alive(), second.stderr()
    assert r.get(key) == "a-later-duplicates-jid"


def test_a_swarm_child_killed_mid_job_hands_the_job_back_still_holding_its_lock(
        r: redis.Redis, config: Config, launch: swarms.Launch) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["uq"]), layout={"alpha": 1})
    victim = swarm.wait_ready()[("alpha", 0)]["pid"]
    client = Client(config)
    item = {"class": "slow_incr", "args": ["u:count", 2], "queue": "uq", "unique_for": 60}
    jid = client.push(item)
    key = lock_key("slow_incr", "uq", ["u:count", 2])
    wait_for(lambda: r.llen("started") == 1)
    os.kill(victim, signal.SIGKILL)
    swarm.wait_ready(not_pids={victim})
    # The parent recovered the killed child's job: it runs again, holding the lock.
    wait_for(lambda: r.llen("started") == 2, timeout=15)
    assert r.get(key) == jid
    assert client.push(item) is None
    wait_for(lambda: r.get("u:count") == "1", timeout=15)
    wait_for(lambda: not r.exists(key))
    assert client.push(item) is not None
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

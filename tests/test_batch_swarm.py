"""Batches across a real swarm: two ``wurk-swarm`` children, SIGKILLs of a
child and a Redis crash and restart (from its fsync-always AOF) mid-batch,
and concurrent completions. Each callback fires exactly once: the callback
jobs INCR a counter, and every kill happens before the last job runs, so
the callback job itself runs once too (a callback job is an ordinary job:
at least once, like any other)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import swarms
from conftest import RedisServer
from swarms import Launch, slot
from waiting import wait_for

import wurk
from wurk.api import BatchStatus
from wurk.push.client import Client
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config

launch = swarms.launch
# The size the issue asks for: about 35 s here, under the 60 s per-test timeout.
JOBS = 10_000

BATCH_JOBS = swarms.PER_PID_REDIS + textwrap.dedent("""
    import json
    import time

    import wurk


    @wurk.job(name="b_row", queue="bq", retry_in=lambda count, exc, payload: 0.2)
    def row(i):
        if i % 500 == 7 and r().sadd("b:failed_once", i):
            raise ValueError(f"row {i} fails once")
        r().incr("b:ran")


    @wurk.job(name="b_gated", queue="bq")
    def gated(i):
        while not r().exists("b:go"):
            time.sleep(0.005)
        r().incr("b:ran")


    @wurk.job(name="b_callback", queue="bq")
    def callback(status, event):
        r().incr(f"b:cb:{event}")
        r().rpush("b:statuses", json.dumps(status))
""")


redis_server = swarms.aof_redis_server
restart = swarms.restart_from_aof


def start_swarm(launch: Launch, tmp_path: Path) -> swarms.SwarmProcess:
    (tmp_path / "batch_jobs.py").write_text(BATCH_JOBS, encoding="utf-8")
    swarm = launch(slot("w", count=2, concurrency=8, queues=["bq"]),
                   require=["swarm_jobs", "batch_jobs"], poll_interval_average=0.2,
                   log_level="warning", layout={"w": 2})
    swarm.wait_ready()
    return swarm


def kill_child(swarm: swarms.SwarmProcess, index: int) -> None:
    os.kill(swarm.pid_at(("w", index)), signal.SIGKILL)


@pytest.fixture
def client(redis_server: RedisServer, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """A client of the test's server, with the jobs registered in this process too."""
    (tmp_path / "batch_jobs.py").write_text(BATCH_JOBS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TEST_REDIS_URL", redis_server.url)
    importlib.import_module("batch_jobs")
    config = Config(redis_url=redis_server.url, redis_retry_base=0.05, redis_retry_cap=0.3,
                    reliable_push=False, log_level="warning")
    yield Client(config, drain_spool=False)
    close_runtime(config)


def test_a_large_batch_fires_each_callback_once_through_kills_and_a_redis_restart(
        launch: Launch, tmp_path: Path, redis_server: RedisServer, r: redis.Redis,
        client: Client) -> None:
    started = time.monotonic()
    with wurk.Batch("big", on_complete=("b_callback", ["complete"]),
                    on_success=("b_callback", ["success"]), client=client) as b:
        b.add_bulk("b_row", ([i] for i in range(JOBS)))
    pushed = time.monotonic()
    assert r.hget(f"b-{b.bid}", "pending") == str(JOBS)
    swarm = start_swarm(launch, tmp_path)

    def ran() -> int:
        return int(r.get("b:ran") or 0)
    wait_for(lambda: ran() >= JOBS // 4, timeout=60, ignoring=(redis.ConnectionError,))
    kill_child(swarm, 0)
    wait_for(lambda: ran() >= JOBS // 2, timeout=60, ignoring=(redis.ConnectionError,))
    restart(redis_server)
    wait_for(lambda: ran() >= 3 * JOBS // 4, timeout=60, ignoring=(redis.ConnectionError,))
    kill_child(swarm, 1)
    wait_for(lambda: r.get("b:cb:success") == "1", timeout=90,
             ignoring=(redis.ConnectionError,), what="the success callback")
    finished = time.monotonic()
    time.sleep(1.5)  # time for a second firing, if there were one
    assert (r.get("b:cb:complete"), r.get("b:cb:success")) == ("1", "1")
    status = BatchStatus.read(b.bid, config=client.config)
    assert (status.state, status.total, status.pending, status.failures) == (
        "success", JOBS, 0, 0)
    assert ran() >= JOBS  # at least once: a killed child's jobs may run again
    success = [s for s in map(json.loads, r.lrange("b:statuses", 0, -1))
               if s["event"] == "success"]
    assert success[0]["total"] == JOBS
    print(f"\nbatch of {JOBS}: pushed in {pushed - started:.1f}s, run in "
          f"{finished - pushed:.1f}s (2 SIGKILLs, 1 Redis restart); runs {ran()}")


def test_concurrent_completions_fire_once(launch: Launch, tmp_path: Path, r: redis.Redis,
                                          client: Client) -> None:
    swarm = start_swarm(launch, tmp_path)
    with wurk.Batch(on_complete=("b_callback", ["complete"]),
                    on_success=("b_callback", ["success"]), client=client) as b:
        b.add_bulk("b_gated", ([i] for i in range(16)))
    # Every thread of both children holds one gated job; then all finish at once.
    wait_for(lambda: r.llen("queue:bq") == 0, timeout=15)
    r.set("b:go", 1)
    wait_for(lambda: r.get("b:cb:success") == "1", timeout=15)
    time.sleep(1)
    assert (r.get("b:cb:complete"), r.get("b:cb:success")) == ("1", "1")
    assert r.get("b:ran") == "16"
    assert swarm.proc.poll() is None

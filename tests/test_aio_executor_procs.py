"""The asyncio executor in real processes (issue #17): ``wurk run --executor asyncio``
and a ``wurk-swarm`` with an asyncio slot, on the suite's redis-server.

A TERM with coroutines running hands back what did not finish; a SIGKILL of an
asyncio swarm child with 500 jobs in flight loses none (reliable fetch's
recovery runs each again); bad executor values are refused as other bad
settings are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import cli_workers
import pytest
import redis
import swarms
from cli_workers import Worker
from swarms import Launch, slot
from waiting import wait_for

from supervisor.topology import TopologyError, parse

pytestmark = pytest.mark.timeout(60)
swarm_launch = swarms.launch
spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
NOISE = ("Task was destroyed", "was never awaited", "Exception ignored")

AIO_JOBS = textwrap.dedent("""
    import asyncio
    import os
    import time

    import redis

    import wurk

    _clients = {}


    def r():
        # One client per process: a forked swarm child makes its own.
        if os.getpid() not in _clients:
            _clients.clear()
            _clients[os.getpid()] = redis.Redis.from_url(os.environ["REDIS_URL"])
        return _clients[os.getpid()]


    @wurk.job(name="x_fly")
    async def fly(tag):
        await asyncio.sleep(0.01)
        r().rpush("x:done", tag)


    @wurk.job(name="x_walk")
    def walk(tag):
        time.sleep(0.01)
        r().rpush("x:done", tag)


    @wurk.job(name="x_long")
    async def long(tag):
        r().rpush("x:started", tag)
        try:
            await asyncio.sleep(30)
        finally:
            r().rpush("x:unwound", tag)


    @wurk.job(name="x_nap")
    async def nap(tag, seconds):
        r().rpush("x:started", tag)
        # Long the first time only: the run the kill interrupts is the one
        # that matters, so the recovered runs finish quickly.
        first = r().sadd("x:began", tag)
        await asyncio.sleep(seconds if first else 0)
        r().sadd("x:finished", tag)
""")


def test_wurk_run_asyncio_drains_both_kinds_and_term_hands_back_the_running(
        r: redis.Redis, spawn: Callable[..., Worker], jobs_dir: Path) -> None:
    (jobs_dir / "aio_jobs.py").write_text(AIO_JOBS, encoding="utf-8")
    worker = spawn("--executor", "asyncio", "-r", "aio_jobs", "-c", "200", "-t", "1")
    tags = {f"a{i}" for i in range(150)} | {f"s{i}" for i in range(30)}
    for tag in sorted(tags):
        cli_workers.push(r, "x_fly" if tag.startswith("a") else "x_walk", tag)
    longs = {cli_workers.push(r, "x_long", f"l{i}")[0] for i in range(5)}
    wait_for(lambda: r.llen("x:done") == 180 and r.llen("x:started") == 5, timeout=30)
    assert set(r.lrange("x:done", 0, -1)) == tags
    worker.send(signal.SIGTERM)
    assert worker.wait(20) == 0
    back = {json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)}
    assert back == longs
    assert sorted(r.lrange("x:unwound", 0, -1)) == [f"l{i}" for i in range(5)]
    for noise in NOISE:
        assert noise not in worker.stderr(), worker.stderr()[-2000:]
    fails = [e for e in worker.events() if e.get("event") == "job.fail"]
    assert len(fails) == 5 and all(e["error"].startswith("HandedBack") for e in fails), fails
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_bad_executor_values_are_refused_clearly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "wurk.cli", "run", "--executor", "gevent"],
                          capture_output=True, text=True, timeout=30, check=False,
                          cwd=tmp_path, env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1"})
    assert done.returncode == 78, done.stderr
    assert "executor must be one of threads, asyncio, got 'gevent'" in done.stderr
    here = tmp_path / "topology.toml"
    base = {"wurk": {"redis_url": "redis://127.0.0.1:1/0"}}
    for value, said in (("gevent", "executor must be one of threads, asyncio, got 'gevent'"),
                        (3, "executor must be str, got 3")):
        with pytest.raises(TopologyError) as info:
            parse({**base, "slot": [{"name": "a", "executor": value}]}, here)
        assert str(info.value) == f"{here}: slot 'a': {said}"
    with pytest.raises(TopologyError, match="executor_threads"):
        parse({**base, "slot": [{"name": "a", "executor_threads": -1}]}, here)
    slot_ok = parse({**base, "slot": [{"name": "a", "executor": "asyncio",
                                       "executor_threads": 4}]}, here).slots[0]
    assert (slot_ok.config.executor, slot_ok.config.executor_threads) == ("asyncio", 4)


def test_a_swarm_with_an_asyncio_slot_drains_async_and_sync_jobs(
        swarm_launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    (tmp_path / "aio_jobs.py").write_text(AIO_JOBS, encoding="utf-8")
    tags = {f"a{i}" for i in range(300)} | {f"s{i}" for i in range(40)}
    for tag in sorted(tags):
        swarms.push(r, "mixed", "x_fly" if tag.startswith("a") else "x_walk", tag)
    swarm = swarm_launch(
        slot("aio", count=2, concurrency=300, queues=["mixed"], executor="asyncio"),
        layout={"aio": 2}, require=["aio_jobs"], reliable_fetch=True)
    swarm.wait_ready()
    wait_for(lambda: r.llen("x:done") == 340, timeout=40)
    assert set(r.lrange("x:done", 0, -1)) == tags
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_a_killed_asyncio_swarm_child_with_500_in_flight_loses_none(
        swarm_launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    (tmp_path / "aio_jobs.py").write_text(AIO_JOBS, encoding="utf-8")
    tags = [f"n{i}" for i in range(500)]
    for tag in tags:
        swarms.push(r, "naps", "x_nap", tag, 2.0)
    swarm = swarm_launch(
        slot("naps", concurrency=500, queues=["naps"], executor="asyncio"),
        layout={"naps": 1}, require=["aio_jobs"], reliable_fetch=True, log_level="warning")
    victim = swarm.wait_ready()[("naps", 0)]["pid"]
    # All 500 are running at once, none finished.
    wait_for(lambda: r.llen("x:started") >= 500, timeout=30)
    assert r.scard("x:finished") == 0
    os.kill(victim, signal.SIGKILL)
    swarm.wait_ready(not_pids={victim})
    # Recovered from the dead child's private list, each runs to its end.
    wait_for(lambda: r.scard("x:finished") == 500, timeout=45)
    assert r.smembers("x:finished") == set(tags)
    assert r.zcard("dead") == 0 and r.llen("queue:naps") == 0
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

"""Job results across real processes: a ``wurk run`` worker, a swarm child,
a worker SIGKILLed mid-job whose recovered job then stores its result once,
and one killed between the result's write and the acknowledgement, whose
job runs again and replaces the result."""

from __future__ import annotations

import signal
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import swarms
from cli_workers import Worker, child_env
from conftest import RedisServer
from swarms import slot
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.push.client import Client
from wurk.redis.runtime import runtime_for
from wurk.results import records as wire
from wurk.results.client import JobFailed, peek
from wurk.runtime.reaper import recover
from wurk.settings.config import Config
from wurk.wire import keys

launch = swarms.launch

JOBS_MODULE = textwrap.dedent("""
    import os
    import time

    import redis

    import wurk

    _clients = {}


    def r():
        pid = os.getpid()
        if pid not in _clients:
            _clients[pid] = redis.Redis.from_url(os.environ["REDIS_URL"])
        return _clients[pid]


    @wurk.job(name="res_pid", store_result=True, result_ttl=300)
    def where(tag):
        return {"tag": tag, "pid": os.getpid()}


    @wurk.job(name="res_fail", store_result=True, retry=False)
    def fail(tag):
        raise KeyError(tag)


    if os.environ.get("RES_DIE_AT_ACK"):
        # A crash between the result's write and the acknowledgement.
        import signal

        from wurk.runtime.reliable_fetch import ReliableFetch

        def die(self, work, jid=None, send=None):
            os.kill(os.getpid(), signal.SIGKILL)

        ReliableFetch.acknowledge = die


    @wurk.job(name="res_count", store_result=True)
    def count(tag):
        return {"tag": tag, "run": r().incr("res:runs")}


    @wurk.job(name="res_hang", store_result=True)
    def hang(tag):
        run = r().incr("res:runs")
        r().rpush("res:started", tag)
        deadline = time.monotonic() + 30
        while r().exists("res:hang") and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"tag": tag, "run": run}
""")


@pytest.fixture
def spawn(redis_server: RedisServer, r: redis.Redis,
          tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    (tmp_path / "rjobs.py").write_text(JOBS_MODULE)
    workers: list[Worker] = []

    def start(**extra: str) -> Worker:
        env = child_env(redis_server.url, tmp_path)
        env.update(extra)
        worker = Worker(["-r", "rjobs", "-q", "rq", "-c", "2"], env, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def push(client: Client, cls: str, tag: str, **extra: Any) -> str:
    jid = client.push({"class": cls, "args": [tag], "queue": "rq", **extra})
    assert jid is not None
    return jid


def test_a_wurk_run_worker_stores_values_and_failures(
        r: redis.Redis, config: Config, spawn: Callable[..., Worker]) -> None:
    client = Client(config)
    worker = spawn()
    ok = push(client, "res_pid", "a", result_ttl=300)
    bad = push(client, "res_fail", "b", result_ttl=60, retry=False)
    value = wurk.result(ok, timeout=20)
    assert worker.alive(), worker.stderr()
    assert value == {"tag": "a", "pid": worker.proc.pid}
    with pytest.raises(JobFailed) as failed:
        wurk.result(bad, timeout=10)
    assert failed.value.error_class == "KeyError" and failed.value.outcome.final
    assert r.ttl(wire.key(ok)) > 290 and r.ttl(wire.key(bad)) <= 60


def test_a_swarm_child_stores_the_result(
        r: redis.Redis, config: Config, launch: swarms.Launch, tmp_path: Path) -> None:
    (tmp_path / "rjobs.py").write_text(JOBS_MODULE)
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["rq"]),
                   layout={"alpha": 2}, require=["swarm_jobs", "rjobs"])
    ready = swarm.wait_ready()
    children = {info["pid"] for info in ready.values()}
    client = Client(config)
    jids = [push(client, "res_pid", str(n), result_ttl=300) for n in range(20)]
    values = [wurk.result(jid, timeout=20) for jid in jids]
    assert [v["tag"] for v in values] == [str(n) for n in range(20)]
    assert {v["pid"] for v in values} <= children


@pytest.mark.timeout(150)  # the waits below, which the guard must outlast
def test_a_job_recovered_after_sigkill_stores_its_result_once(
        r: redis.Redis, config: Config, spawn: Callable[..., Worker]) -> None:
    client = Client(config)
    r.set("res:hang", 1)
    first = spawn()
    jid = push(client, "res_hang", "k", result_ttl=300)
    got: list[Any] = []
    # Two worker boots, a kill and a recovery: on a loaded machine each boot
    # alone can take seconds, so the wait spans them all with room to spare.
    across = 3 * EVENTUALLY
    waiter = threading.Thread(target=lambda: got.append(wurk.result(jid, timeout=across)))
    waiter.start()  # waits across the kill and the recovery
    wait_for(lambda: r.llen("res:started") == 1 or not first.alive(), timeout=15)
    assert first.alive(), first.stderr()
    (identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(EVENTUALLY) == -signal.SIGKILL
    assert peek(jid) is None  # the killed run stored nothing

    recover(runtime_for(config), identity)  # what the reaper or the swarm parent does
    r.delete("res:hang")
    second = spawn()
    waiter.join(across)
    assert second.alive(), second.stderr()
    assert got == [{"tag": "k", "run": 2}]  # the recovered run's, the only one stored
    assert r.get("res:runs") == "2"
    wait_for(lambda: r.llen(keys.queue("rq")) == 0 and not any(
        r.llen(k) for k in r.keys("wurk:wip:*:rq")))
    outcome = peek(jid)
    assert outcome is not None and outcome.value == {"tag": "k", "run": 2}


def test_a_crash_between_the_result_and_the_ack_runs_the_job_again_and_replaces_it(
        r: redis.Redis, config: Config, spawn: Callable[..., Worker]) -> None:
    client = Client(config)
    first = spawn(RES_DIE_AT_ACK="1")
    jid = push(client, "res_count", "c", result_ttl=300)
    assert wurk.result(jid, timeout=20) == {"tag": "c", "run": 1}  # written, then the crash
    assert first.wait(10) == -signal.SIGKILL
    (identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    assert r.llen(keys.wip(identity, "rq")) == 1  # never acknowledged

    recover(runtime_for(config), identity)
    second = spawn()
    wait_for(lambda: r.get("res:runs") == "2" or not second.alive(), timeout=15)
    assert second.alive(), second.stderr()
    wait_for(lambda: (o := peek(jid)) is not None and o.value == {"tag": "c", "run": 2})
    assert wurk.result(jid, timeout=0) == {"tag": "c", "run": 2}

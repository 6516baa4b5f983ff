"""What ``wurk-swarm`` says about itself: USR2 status lines (read from each
slot's own Redis), the health probe, process titles, and the pid, slot,
index and thread on a child's job log lines.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest
import redis
import swarms
from conftest import start_redis
from swarms import REPO, Launch, SwarmProcess, push, slot
from waiting import wait_for

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


def test_usr2_logs_each_childs_status(launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, shutdown_timeout=1)
    swarm.wait_ready()
    push(r, "qb", "slow_incr", "never", 30)
    wait_for(lambda: swarm.ready()[("beta", 0)]["hash"]["busy"] == "1",
             what="beta busy in its heartbeat")
    swarm.send(signal.SIGUSR2)
    lines = swarm.wait_events("child.status", count=3)
    by_key = {(e["slot"], e["index"]): e for e in lines}
    ready = swarm.ready()
    assert set(by_key) == set(ready)
    for key, event in by_key.items():
        assert event["pid"] == ready[key]["pid"]
        assert event["rss_kb"] > 1000
        assert isinstance(event["age"], float | int) and event["age"] >= 0
        assert 0 <= event["silent"] < 5  # pulsed within a few 0.5 s heartbeats
    assert by_key[("beta", 0)]["busy"] == 1
    assert by_key[("alpha", 0)]["busy"] == 0


def test_usr2_survives_a_busy_count_that_is_not_a_number(launch: Launch,
                                                         r: redis.Redis) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]), layout={"alpha": 1})
    info = swarm.wait_ready()[("alpha", 0)]
    os.kill(info["pid"], signal.SIGSTOP)  # so its heartbeat cannot rewrite the field
    try:
        r.hset(info["identity"], "busy", "abc")
        swarm.send(signal.SIGUSR2)
        status = swarm.wait_events("child.status")[0]
    finally:
        os.kill(info["pid"], signal.SIGCONT)
    assert status["pid"] == info["pid"] and status["busy"] is None
    wait_for(lambda: r.hget(info["identity"], "busy") == "0", what="a beat rewrote busy")
    swarm.send(signal.SIGUSR2)  # the supervise loop is still there to answer
    assert swarm.wait_events("child.status", count=2)[1]["busy"] == 0
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_status_reads_busy_from_each_slots_own_redis(launch: Launch, r: redis.Redis) -> None:
    other = start_redis()
    try:
        r2 = other.client()
        swarm = launch(slot("alpha", concurrency=1, queues=["qa"]),
                       slot("beta", concurrency=1, queues=["qb"], redis_url=other.url),
                       shutdown_timeout=1)
        ready = swarm.wait_events("child.ready", count=2)
        push(r2, "qb", "slow_incr", "never", 30)
        beta = next(e for e in ready if e["slot"] == "beta")
        wait_for(lambda: r2.hget(beta["identity"], "busy") == "1", what="beta busy")
        assert r.hget(beta["identity"], "info") is None  # it beats in its own Redis only
        swarm.send(signal.SIGUSR2)
        lines = {e["slot"]: e for e in swarm.wait_events("child.status", count=2)}
        assert lines["beta"]["busy"] == 1
        assert lines["alpha"]["busy"] == 0
        swarm.send(signal.SIGTERM)
        assert swarm.wait_exit() == 0
        assert r2.llen("queue:qb") == 1  # pushed back to the slot's own Redis
        r2.close()
    finally:
        other.stop()


def probe(swarm: SwarmProcess, pid: int) -> subprocess.CompletedProcess[str]:
    topology = sorted(swarm.log_path.parent.glob("topology-*.toml"))[-1]
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "--topology", str(topology), "--probe",
         "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def test_probe_passes_for_a_beating_swarm_and_fails_for_another_pid(
        launch: Launch) -> None:
    swarm = launch(slot("alpha", count=2, queues=["qa"]), slot("beta", queues=["qb"]),
                   layout={"alpha": 2, "beta": 1})
    swarm.wait_ready()
    good = probe(swarm, swarm.pid)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "alpha: 2" in good.stdout and "beta: 1" in good.stdout
    other = probe(swarm, swarm.pid + 100_000)
    assert other.returncode == 1
    assert "alpha: 0" in other.stdout
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_parent_and_children_show_what_they_are_in_their_titles(launch: Launch) -> None:
    swarm = launch(slot("alpha", concurrency=3, queues=["qa"]), layout={"alpha": 1})
    ready = swarm.wait_ready()
    parent_title = wait_for(lambda: " ".join(psutil.Process(swarm.pid).cmdline()).startswith(
        "wurk-swarm: parent") and " ".join(psutil.Process(swarm.pid).cmdline()),
        what="parent title")
    assert "running" in parent_title and "alpha: 1/1" in parent_title
    child = psutil.Process(ready[("alpha", 0)]["pid"])
    assert wait_for(lambda: "of 3 busy" in " ".join(child.cmdline()), what="child title")
    assert " ".join(child.cmdline()).startswith("wurk-swarm: child alpha#0")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_a_childs_job_lines_say_its_pid_slot_index_and_thread(launch: Launch,
                                                              r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=1, concurrency=2, queues=["qa"]), layout={"alpha": 1},
                   log_level="info")
    [info] = swarm.wait_ready().values()
    push(r, "qa", "record", "x")
    [done] = swarm.wait_events("job.done")
    assert (done["pid"], done["slot"], done["index"]) == (info["pid"], "alpha", 0)
    assert done["tid"] and done["jid"] and done["queue"] == "qa"
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

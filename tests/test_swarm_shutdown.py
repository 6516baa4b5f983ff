"""``wurk-swarm`` shutdown: TERM and INT let running jobs finish, jobs that
outlive the timeout go back to their queue, and a KILLed parent takes its
children down with it and loses no job.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py).
"""

from __future__ import annotations

import signal
import time

import pytest
import redis
import swarms
from swarms import Launch, gone, push, queued_jids, slot
from waiting import wait_for

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_term_lets_running_jobs_finish_and_exits_0(launch: Launch, r: redis.Redis,
                                                   signum: int) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   layout={"alpha": 2}, shutdown_timeout=5)
    ready = swarm.wait_ready()
    for _ in range(4):
        push(r, "qa", "slow_incr", "finished", 1.5)
    wait_for(lambda: r.llen("started") == 4, what="4 jobs started")
    pids = {info["pid"] for info in ready.values()}
    assert r.get("finished") is None

    swarm.send(signum)
    assert swarm.wait_exit(15) == 0
    assert r.get("finished") == "4"
    assert r.llen("queue:qa") == 0
    assert all(gone(pid) for pid in pids)
    assert r.smembers("processes") == set()
    assert swarm.events("swarm.drained")[0]["exit_code"] == 0


def test_term_pushes_back_jobs_that_outlive_the_timeout(launch: Launch,
                                                         r: redis.Redis) -> None:
    # A long grace: children that outstayed the timeout would show as time.
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   layout={"alpha": 2}, shutdown_timeout=1, shutdown_grace=30)
    ready = swarm.wait_ready()
    jids = {push(r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    wait_for(lambda: r.llen("started") == 2, what="2 jobs started")

    started = time.monotonic()
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(20) == 0
    # The 1 s timeout, then out (five times over for a loaded machine); never
    # the 30 s jobs or the 30 s grace.
    assert time.monotonic() - started < 10
    assert not swarm.events("child.kill")
    assert set(queued_jids(r, "qa")) == jids
    assert r.get("never") is None
    assert all(gone(info["pid"]) for info in ready.values())
    assert sum(e["jobs"] for e in swarm.events("shutdown.requeued")) == 2


def test_killed_parent_takes_its_children_down_and_their_jobs_go_back(
        launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, shutdown_timeout=1)
    ready = swarm.wait_ready()
    pids = {info["pid"] for info in ready.values()}
    jids = {push(r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    jids_b = {push(r, "qb", "slow_incr", "never", 30)}
    wait_for(lambda: r.llen("started") == 3, what="3 jobs started")
    assert r.llen("queue:qa") == r.llen("queue:qb") == 0

    swarm.send(signal.SIGKILL)
    killed_at = time.monotonic()
    swarm.wait_exit(5)
    # PDEATHSIG, then a drain on the 1 s timeout: about 1.5 s, and well under
    # the 30 s the jobs would keep an orphan alive for.
    wait_for(lambda: all(gone(pid) for pid in pids), timeout=15, interval=0.02,
             what="every child gone")
    assert time.monotonic() - killed_at < 15
    assert set(queued_jids(r, "qa")) == jids
    assert set(queued_jids(r, "qb")) == jids_b
    assert r.smembers("processes") == set()

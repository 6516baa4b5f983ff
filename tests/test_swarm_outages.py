"""``wurk-swarm`` through a Redis outage: children that die meanwhile do not
stop the swarm, and a drain during the outage ends on time, losing no job.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py)
on a redis-server of the test's own, stopped and started again.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import swarms
from conftest import RedisServer, start_redis
from swarms import Launch, SwarmProcess, push, queued_jids, slot
from waiting import wait_for

from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.reaper import recover
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


class Outage:
    """A redis-server of the test's own that goes away and comes back on its
    port with its data (AOF, fsync always)."""

    PERSIST = ("--appendonly", "yes", "--appendfsync", "always")

    def __init__(self) -> None:
        self.server = start_redis(*self.PERSIST)
        self.began = 0.0

    @property
    def url(self) -> str:
        return self.server.url

    def begin(self) -> None:
        self.server.stop()
        self.began = time.monotonic()

    def end(self) -> float:
        """Start Redis again; returns how long it was down."""
        workdir = self.server.workdir
        restarted = start_redis(*self.PERSIST, "--dir", workdir, port=self.server.port)
        shutil.rmtree(restarted.workdir, ignore_errors=True)
        self.server = RedisServer(restarted.port, restarted.proc, workdir)
        return time.monotonic() - self.began

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.server.workdir, ignore_errors=True)


@pytest.fixture
def outage() -> Iterator[Outage]:
    own = Outage()
    yield own
    own.close()


def launch_on(launch: Launch, outage: Outage, *slots: str, **settings: Any) -> SwarmProcess:
    env = {"REDIS_URL": outage.url, "TEST_REDIS_URL": outage.url}
    swarm = launch(*slots, env=env, redis_url=outage.url, **settings)
    swarm.r = outage.server.client()
    return swarm


def test_a_redis_outage_with_children_dying_does_not_stop_the_swarm(
        launch: Launch, outage: Outage) -> None:
    swarm = launch_on(launch, outage, slot("alpha", count=2, concurrency=1, queues=["qa"]),
                      layout={"alpha": 2}, boot_failure_limit=2, respawn_backoff_max=0.5)
    swarm.wait_ready()
    outage.begin()
    deaths = 3
    for death in range(1, deaths + 1):
        # Any child, a healthy one first, then replacements waiting for Redis.
        os.kill(max(swarm.child_pids()), signal.SIGKILL)
        swarm.wait_events("child.spawned", count=2 + death)
        swarm.wait_events("redis.unreachable", count=death)
    # Before: each replacement failed its start-up PING with exit 69, and two
    # of those made the swarm give up (exit 69), healthy child included.
    assert swarm.proc.poll() is None
    assert not swarm.events("swarm.giving_up")
    assert not swarm.events("child.boot_failed")
    down_for = outage.end()
    swarm.r = outage.server.client()
    swarm.wait_ready(timeout=20)
    push(swarm.r, "qa", "record", "after-the-outage")
    wait_for(lambda: swarm.r.llen("done") == 1, what="a job run after the outage")
    print(f"survived a {down_for:.1f} s Redis outage with {deaths} child deaths")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_a_drain_during_a_redis_outage_ends_on_time_with_exit_0(
        launch: Launch, outage: Outage) -> None:
    # Redis retries that, unbounded, last far past the 20 s grace (ten attempts
    # with up to 4 s between them), so a drain that ignored its deadline is
    # KILLed and shows; a drain that keeps it ends in seconds.
    swarm = launch_on(launch, outage, slot("alpha", count=2, concurrency=1, queues=["qa"]),
                      layout={"alpha": 2}, shutdown_timeout=1, shutdown_grace=20,
                      redis_retry_attempts=10, redis_retry_base=1.0, redis_retry_cap=4.0)
    swarm.wait_ready()
    jids = {push(swarm.r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    wait_for(lambda: swarm.r.llen("started") == 2, what="2 jobs started")
    outage.begin()
    started = time.monotonic()
    swarm.send(signal.SIGTERM)
    code = swarm.wait_exit(40)
    elapsed = time.monotonic() - started
    # Before: the children's Redis retries outlasted timeout + grace, the
    # parent KILLed them and exited 1.
    assert code == 0
    assert not swarm.events("child.kill")
    # Timeout, STOP_MARGIN, exit (about 2.5 s), with room for a loaded machine.
    assert elapsed < 10, elapsed
    outage.end()
    # Nothing lost: what could not be given back waits in its private list
    # until recovery (the reaper, or the next parent) returns it.
    client = outage.server.client()
    config = Config(redis_url=outage.url)
    try:
        for owner in client.smembers("wurk:wip:owners"):
            recover(runtime_for(config), owner)
    finally:
        close_runtime(config)
    assert set(queued_jids(client, "qa")) == jids

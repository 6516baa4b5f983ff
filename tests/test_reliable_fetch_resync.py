"""Resync: a private list and what the process knows it holds are brought
back in step. Strays (a claim whose reply was lost, an acknowledgement a
promoted replica lacks) go back to their queue and run once.

Real Redis, real launchers; a FaultProxy drops the replies and requests.
"""

from __future__ import annotations

import time

import redis
from faultproxy import FaultProxy
from fetching import (
    Define,
    Launch,
    blocked_in_brpoplpush,
    launch_gated,
    payload,
    private_lists,
    quiet_background,
    reliable,
    wip,
)
from structlog.testing import capture_logs
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config


def test_resync_returns_strays_and_keeps_what_is_really_held(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config = tuned(config, concurrency=1)
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(EVENTUALLY)
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


def test_lost_claim_reply_is_resynced_and_the_job_runs_once(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    # Blocks of a second: the block the test sees must still be under way
    # when it arms the proxy, or the dropped reply is another request's.
    config = quiet_background(config, proxy, queues=["rffirst", "rfsecond"], fetch_timeout=1.0,
                              reliable_poll_interval=1.0)
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
        wait_for(lambda: ran, timeout=8)
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
    config = quiet_background(config, proxy)
    ran: list[str] = []

    def work(tag: str) -> None:
        if tag == "poke":
            # The fetcher is idle (the one thread is here), so this call is
            # the next request through the proxy: dropped, then retried.
            proxy.drop_next_request()
            assert runtime_for(config).pool.call("GET", "anything", idempotent=True) is None
        ran.append(tag)

    job = define(work)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    first = payload(job.name, "first")
    rb.lpush("queue:default", first)
    wait_for(lambda: ran == ["first"] and not rb.exists(mine))
    disruptions = runtime_for(config).pool.disruptions
    # The acknowledgement "lost": the job is back in our list. Nothing has
    # gone wrong in this process, so nothing looks.
    rb.lpush(mine, first)
    time.sleep(0.5)
    assert ran == ["first"] and rb.lrange(mine, 0, -1) == [first]

    with capture_logs() as logs:
        rb.lpush("queue:default", payload(job.name, "poke"))
        wait_for(lambda: ran[-1:] == ["first"] and len(ran) == 3, timeout=5)
    assert ran == ["first", "poke", "first"]
    assert runtime_for(config).pool.disruptions > disruptions
    assert not any(e["event"] == "fetch.error" for e in logs)  # the fetcher saw no error
    assert {"event": "fetch.resynced", "jobs": 1, "log_level": "warning"} in logs
    wait_for(lambda: not rb.exists(mine))
    assert rb.llen("queue:default") == 0

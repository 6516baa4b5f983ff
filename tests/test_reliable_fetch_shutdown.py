"""Quiet and stop with reliable fetch: quiet gives back what no thread started
and claims nothing more; a hard stop requeues the running job and drops its
late finish; what a stop leaves goes back unblamed; and in a Redis outage
quiet and stop lose nothing.

Real Redis, real launchers; a FaultProxy for the outage.
"""

from __future__ import annotations

import time

import redis
from faultproxy import FaultProxy
from fetching import (
    Define,
    Gate,
    Launch,
    blocked_in_brpoplpush,
    jid_of,
    launch_gated,
    payload,
    private_lists,
    quiet_background,
    reliable,
    wip,
)
from waiting import wait_for

from wurk.runtime.reaper import sweep
from wurk.settings.config import Config
from wurk.wire import keys


def test_quiet_gives_back_unstarted_jobs_and_claims_nothing_more(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    fetch = reliable(launcher)
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        # A claim that lands after every thread is busy (its thread gave up
        # waiting): the job is claimed but nobody starts it.
        unstarted = payload(job.name, "unstarted")
        rb.lpush("queue:default", unstarted)
        assert fetch._claim(1, []) == 1
        assert rb.lrange(mine, 0, -1) == [unstarted, running]
        assert rb.llen("queue:default") == 0

        launcher.quiet()
        assert rb.lrange("queue:default", 0, -1) == [unstarted]
        assert rb.lrange(mine, 0, -1) == [running]

        later = payload(job.name, "later")
        rb.lpush("queue:default", later)
        time.sleep(0.5)
        assert rb.lrange("queue:default", 0, -1) == [later, unstarted]
        assert rb.lrange(mine, 0, -1) == [running]
    finally:
        gate.release.set()
    # The running job finishes and is acknowledged even though we are quiet.
    wait_for(lambda: not rb.exists(mine))
    launcher.stop()
    assert gate.runs == ["running"]
    assert rb.lrange("queue:default", 0, -1) == [later, unstarted]
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    assert not r.exists(keys.wip_queues(launcher.identity))
    assert int(r.get("stat:processed") or 0) == 1


def test_quiet_while_blocked_leaves_new_jobs_in_the_queue(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    # The fetcher sits in a long BRPOPLPUSH for an idle thread when quiet
    # arrives; a job pushed then must stay in the queue, not wait in memory.
    config.concurrency = 1
    config.fetch_timeout = 2.0
    ran: list[str] = []
    job = define(ran.append)
    launcher = launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    launcher.quiet()
    raw = payload(job.name, "after-quiet")
    rb.lpush("queue:default", raw)
    wait_for(lambda: not blocked_in_brpoplpush(r), timeout=3)
    time.sleep(0.1)
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert not rb.exists(wip(launcher.identity, "default"))
    launcher.stop()
    assert ran == []
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)


def test_hard_stop_requeues_the_running_job_and_drops_its_late_finish(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 1
    config.shutdown_timeout = 0.5
    gate = Gate()
    job = define(gate.run)
    raw = payload(job.name, "long")
    pill = keys.pill(jid_of(raw))
    rb.set(pill, 1)
    rb.expire(pill, 3600)
    rb.lpush("queue:default", raw)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        assert rb.lrange(mine, 0, -1) == [raw]
        newer = payload(job.name, "newer")
        rb.lpush("queue:default", newer)
        t0 = time.monotonic()
        assert launcher.stop() == 1
        assert time.monotonic() - t0 < 2.0
        # Back at the fetch (oldest) end: it runs next.
        assert rb.lrange("queue:default", 0, -1) == [newer, raw]
        assert not rb.exists(mine)
        assert private_lists(rb, launcher.identity) == []
        assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    finally:
        gate.release.set()
    assert gate.finished.wait(3)
    wait_for(lambda: all(not t.is_alive() for t in launcher.manager._threads))
    time.sleep(0.1)
    # The late finish neither acknowledged (the pill is intact) nor counted.
    assert rb.get(pill) == b"1"
    assert launcher.manager.counters.take() == (0, 0)
    assert int(r.get("stat:processed") or 0) == 0
    assert rb.lrange("queue:default", 0, -1) == [newer, raw]
    assert gate.runs == ["long"]


def test_what_a_stop_leaves_in_the_private_list_goes_back_unblamed(
        r: redis.Redis, rb: redis.Redis, config: Config, launch: Launch) -> None:
    launcher = launch()
    mine = wip(launcher.identity, "default")
    left = payload("Left", "behind")  # say, a give-back that failed during the drain
    wait_for(lambda: blocked_in_brpoplpush(r))
    rb.lpush(mine, left)
    launcher.stop()
    assert rb.lrange("queue:default", 0, -1) == [left]
    # The process did not die: nothing to blame, nothing to suspect.
    assert r.get(keys.pill(jid_of(left))) is None
    assert not rb.exists(keys.SUSPECTS)
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)


def test_quiet_and_stop_in_a_redis_outage_lose_nothing(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    quiet_background(config, proxy)
    config.redis_retry_attempts = 1
    config.shutdown_timeout = 0.3
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(3)
        unstarted = payload(job.name, "unstarted")
        rb.lpush("queue:default", unstarted)
        assert reliable(launcher)._claim(1, []) == 1  # claimed, nobody free to start it
        proxy.refuse()
        proxy.half_close()
        t0 = time.monotonic()
        launcher.quiet()  # cannot hand the unstarted job back, and must not blow up
        launcher.stop()
        assert time.monotonic() - t0 < 5.0
        assert launcher.stopped.is_set()
    finally:
        gate.release.set()
        proxy.heal()
    assert gate.finished.wait(3)
    # Nothing lost: both jobs wait in the private list for the reaper.
    assert sorted(rb.lrange(mine, 0, -1)) == sorted([running, unstarted])
    assert launcher.identity in r.smembers(keys.WIP_OWNERS)
    r.delete(launcher.identity, keys.REAPER_LOCK)  # its heartbeat lapses
    assert sweep(config) == 1
    assert sorted(rb.lrange("queue:default", 0, -1)) == sorted([running, unstarted])
    assert gate.runs == ["running"]

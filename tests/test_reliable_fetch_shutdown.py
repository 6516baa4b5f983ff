"""Quiet and stop with reliable fetch: quiet gives back what no thread started
and claims nothing more; a hard stop requeues the running job and drops its
late finish; what a stop leaves goes back unblamed; and in a Redis outage
quiet and stop lose nothing.

Real Redis, real launchers; a FaultProxy for the outage.
"""

from __future__ import annotations

import time
from typing import Any

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
from structlog.testing import capture_logs
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.redis.runtime import runtime_for
from wurk.runtime.reaper import sweep
from wurk.settings.config import Config
from wurk.wire import keys


def test_quiet_gives_back_unstarted_jobs_and_claims_nothing_more(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config = tuned(config, concurrency=1)
    gate, job, running, launcher = launch_gated(rb, define, launch, "running")
    fetch = reliable(launcher)
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(EVENTUALLY)
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
    config = tuned(config, concurrency=1, fetch_timeout=2.0)
    ran: list[str] = []
    job = define(ran.append)
    launcher = launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    launcher.quiet()
    raw = payload(job.name, "after-quiet")
    rb.lpush("queue:default", raw)
    wait_for(lambda: not blocked_in_brpoplpush(r))
    time.sleep(0.1)
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert not rb.exists(wip(launcher.identity, "default"))
    launcher.stop()
    assert ran == []
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)


def test_a_stop_ends_a_blocking_fetch_at_once_and_keeps_its_time_for_the_goodbye(
        r: redis.Redis, config: Config, launch: Launch) -> None:
    # A fetch far longer than the whole stop: waiting it out would leave no
    # time for the goodbye (the process would stay listed for a minute).
    config = tuned(config, concurrency=1, fetch_timeout=30.0, shutdown_timeout=1.0)
    launcher = launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    assert launcher.identity in r.smembers(keys.PROCESSES)
    started = time.monotonic()
    with capture_logs() as logs:
        launcher.stop()
    assert time.monotonic() - started < 15  # far below the 30 s fetch it did not wait out
    assert not blocked_in_brpoplpush(r)
    assert launcher.identity not in r.smembers(keys.PROCESSES)
    assert not [e for e in logs if e["event"] in ("heartbeat.goodbye_failed",
                                                  "heartbeat.flush_failed",
                                                  "launcher.release_failed")]


def test_without_client_commands_a_stop_still_ends_cleanly(
        r: redis.Redis, redis_server: Any, config: Config, launch: Launch) -> None:
    # An ACL user that may not run CLIENT: the fetch still works, and a stop
    # waits the (short) block out instead of ending it.
    r.execute_command("ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all",
                      "-client")
    try:
        config = tuned(config, redis_url=f"redis://noclient:pw@127.0.0.1:{redis_server.port}/0",
                       concurrency=1, fetch_timeout=1.0, shutdown_timeout=3.0)
        launcher = launch()
        wait_for(lambda: blocked_in_brpoplpush(r))
        launcher.stop()
        assert launcher.identity not in r.smembers(keys.PROCESSES)
    finally:
        r.execute_command("ACL", "DELUSER", "noclient")


def test_hard_stop_requeues_the_running_job_and_drops_its_late_finish(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config = tuned(config, concurrency=1, shutdown_timeout=0.5)
    gate = Gate(hold=30)
    job = define(gate.run)
    raw = payload(job.name, "long")
    pill = keys.pill(jid_of(raw))
    rb.set(pill, 1)
    rb.expire(pill, 3600)
    rb.lpush("queue:default", raw)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(EVENTUALLY)
        assert rb.lrange(mine, 0, -1) == [raw]
        newer = payload(job.name, "newer")
        rb.lpush("queue:default", newer)
        t0 = time.monotonic()
        assert launcher.stop() == 1
        # The 0.5 s deadline ten times over (a loaded machine), not the job's 30 s.
        assert time.monotonic() - t0 < 5.0
        # Back at the fetch (oldest) end: it runs next.
        assert rb.lrange("queue:default", 0, -1) == [newer, raw]
        assert not rb.exists(mine)
        assert private_lists(rb, launcher.identity) == []
        assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    finally:
        gate.release.set()
    assert gate.finished.wait(EVENTUALLY)
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
    # a drain that waited on a reply would show
    config = quiet_background(config, proxy, redis_retry_attempts=1, shutdown_timeout=0.3,
                              redis_read_timeout=30.0)
    gate, job, running, launcher = launch_gated(rb, define, launch, "running", hold=30)
    mine = wip(launcher.identity, "default")
    try:
        assert gate.started.wait(EVENTUALLY)
        unstarted = payload(job.name, "unstarted")
        rb.lpush("queue:default", unstarted)
        assert reliable(launcher)._claim(1, []) == 1  # claimed, nobody free to start it
        proxy.refuse()
        proxy.half_close()
        t0 = time.monotonic()
        launcher.quiet()  # cannot hand the unstarted job back, and must not blow up
        launcher.stop()
        # The 0.3 s deadline and STOP_MARGIN, with room for a loaded machine;
        # never the job's 30 s or a 30 s read.
        assert time.monotonic() - t0 < 10.0
        assert launcher.stopped.is_set()
    finally:
        gate.release.set()
        proxy.heal()
    assert gate.finished.wait(EVENTUALLY)
    # Nothing lost: both jobs wait in the private list for the reaper.
    assert sorted(rb.lrange(mine, 0, -1)) == sorted([running, unstarted])
    assert launcher.identity in r.smembers(keys.WIP_OWNERS)
    r.delete(launcher.identity, keys.REAPER_LOCK)  # its heartbeat lapses
    assert sweep(runtime_for(config)) == 1
    assert sorted(rb.lrange("queue:default", 0, -1)) == sorted([running, unstarted])
    assert gate.runs == ["running"]

"""The periodic loop on one real Redis and a fake clock: DST, missed ticks,
pause, the fence and the guard, a Redis restart."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from conftest import start_redis
from periodic_support import FakeClock, Leader
from waiting import wait_for

from wurk.api.periodic import PeriodicSet
from wurk.core import threads
from wurk.push.periodic import PeriodicEntry, make_entry
from wurk.redis.runtime import close_runtime
from wurk.runtime.periodic import PeriodicLoop
from wurk.runtime.periodic_guard import DONE, FIRED, NOT_LEADER
from wurk.settings.config import Config

MakeLoop = Callable[..., PeriodicLoop]


def epoch(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


@pytest.fixture
def make_loop(config: Config) -> Iterator[MakeLoop]:
    made: list[PeriodicLoop] = []

    def make(entries: list[PeriodicEntry], clock: FakeClock, *, grace: float = 60.0,
             cfg: Config | None = None, start: bool = False) -> PeriodicLoop:
        c = cfg or config
        lease = Leader("periodic", ttl=2.0, config=c).start()
        loop = PeriodicLoop(c, entries, lease=lease, clock=clock, grace=grace, interval=0.05)
        made.append(loop)
        if start:
            loop.start()
        assert wait_for(lease.is_leader, timeout=10, what="leadership")
        return loop

    yield make
    for loop in made:
        loop.stop()


def pushed(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(x) for x in reversed(r.lrange(f"queue:{queue}", 0, -1))]


def ticks(r: redis.Redis) -> list[int]:
    return [j["periodic"]["tick"] for j in pushed(r)]


DST_CASES = [
    # zone, schedule, the first day, the three expected ticks (UTC)
    ("Europe/Berlin", "30 2 * * *", "2026-03-28T00:00:00+00:00",
     ["2026-03-28T01:30:00+00:00", "2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"]),
    ("Europe/Berlin", "30 2 * * *", "2026-10-24T00:00:00+00:00",
     ["2026-10-24T00:30:00+00:00", "2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]),
    ("America/New_York", "30 2 * * *", "2026-03-07T00:00:00+00:00",
     ["2026-03-07T07:30:00+00:00", "2026-03-08T07:00:00+00:00", "2026-03-09T06:30:00+00:00"]),
    ("America/New_York", "30 1 * * *", "2026-10-31T00:00:00+00:00",
     ["2026-10-31T05:30:00+00:00", "2026-11-01T05:30:00+00:00", "2026-11-02T06:30:00+00:00"]),
]


@pytest.mark.parametrize(("tz", "schedule", "start", "expected"), DST_CASES,
                         ids=["berlin-spring", "berlin-fall", "new-york-spring", "new-york-fall"])
def test_a_daily_job_runs_once_on_dst_days(make_loop: MakeLoop, r: redis.Redis, tz: str,
                                           schedule: str, start: str,
                                           expected: list[str]) -> None:
    clock = FakeClock(epoch(start))
    loop = make_loop([make_entry(schedule, "Nightly", tz=tz)], clock)
    for _ in range(3 * 24 * 12):  # three days, a pass every five minutes
        clock.advance(300)
        loop.run_pass()
    assert ticks(r) == [epoch(t) for t in expected]


def test_an_hourly_job_runs_in_both_repeated_hours_of_a_fall_back_night(
        make_loop: MakeLoop, r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-10-25T00:00:00+00:00"))
    loop = make_loop([make_entry("30 * * * *", "Hourly", tz="Europe/Berlin")], clock)
    for _ in range(4 * 12):
        clock.advance(300)
        loop.run_pass()
    # 02:30 CEST, 02:30 CET, 03:30 CET, 04:30 CET: real hours, none twice.
    assert ticks(r) == [epoch(f"2026-10-25T0{h}:30:00+00:00") for h in range(4)]


def test_missed_once_enqueues_the_latest_missed_tick_once(make_loop: MakeLoop,
                                                          r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:10:00+00:00"))
    loop = make_loop([make_entry("0 * * * *", "Hourly", missed="once")], clock)
    loop.run_pass()
    clock.advance(5 * 3600)  # down from 10:10 to 15:10: five ticks missed
    assert loop.run_pass() == 1
    assert loop.run_pass() == 0
    assert ticks(r) == [epoch("2026-06-01T15:00:00+00:00")]
    clock.advance(3600)
    assert loop.run_pass() == 1
    assert ticks(r)[-1] == epoch("2026-06-01T16:00:00+00:00")


def test_missed_skip_enqueues_nothing_for_the_downtime(make_loop: MakeLoop,
                                                       r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:10:00+00:00"))
    loop = make_loop([make_entry("0 * * * *", "Hourly", missed="skip")], clock)
    loop.run_pass()
    clock.advance(5 * 3600)
    assert loop.run_pass() == 0
    assert r.hget("loops:Hourly", "tick") == str(epoch("2026-06-01T15:00:00+00:00"))
    clock.advance(3600 - 10 * 60)  # 16:00, on time
    assert loop.run_pass() == 1
    assert ticks(r) == [epoch("2026-06-01T16:00:00+00:00")]


def test_late_ticks_within_grace_are_caught_up_one_per_pass(make_loop: MakeLoop,
                                                            r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
    loop = make_loop([make_entry("* * * * *", "Minutely")], clock, grace=600)
    loop.run_pass()
    clock.advance(3 * 60)  # a hand-over that took three minutes
    assert [loop.run_pass() for _ in range(4)] == [1, 1, 1, 0]
    assert ticks(r) == [epoch(f"2026-06-01T10:0{m}:00+00:00") for m in (1, 2, 3)]


def test_pause_and_unpause(make_loop: MakeLoop, r: redis.Redis, config: Config) -> None:
    clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
    loop = make_loop([make_entry("* * * * *", "Minutely", name="m")], clock)
    loop.run_pass()
    api = PeriodicSet(config)
    api.pause("m")
    assert api.fetch("m").paused and api.fetch("m").next_run is None
    clock.advance(120)
    assert loop.run_pass() == 0
    api.unpause("m", now=clock())
    assert loop.run_pass() == 0  # the ticks that fell during the pause do not run
    clock.advance(60)
    assert loop.run_pass() == 1
    assert ticks(r) == [epoch("2026-06-01T10:03:00+00:00")]
    assert [run.jid for run in api.history("m")] == [pushed(r)[0]["jid"]]


def test_a_declared_pause_is_the_initial_state_only(make_loop: MakeLoop, config: Config,
                                                    r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
    first = make_loop([make_entry("* * * * *", "Minutely", name="m", paused=True)], clock)
    first.run_pass()
    first.stop()
    PeriodicSet(config).unpause("m", now=clock())
    loop = make_loop([make_entry("* * * * *", "Minutely", name="m", paused=True)], clock)
    loop.run_pass()  # registers again: the unpause from the CLI stands
    clock.advance(60)
    assert loop.run_pass() == 1


def test_the_fence_refuses_a_leader_whose_lease_was_taken(make_loop: MakeLoop,
                                                          r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
    entry = make_entry("* * * * *", "Minutely")
    loop = make_loop([entry], clock)
    loop.run_pass()
    fence = loop.lease.fence()
    assert fence is not None
    r.set(fence[0], "someone-else")  # the lease went to another process
    clock.advance(60)
    assert loop.lease.is_leader()  # it still believes it leads...
    assert loop.run_pass() == 0  # ...and the tick script refuses it
    assert loop.guard.outcome == "not_leader" and pushed(r) == []
    assert loop.guard.claim(loop.pool, entry, int(clock()) // 60 * 60, "fire", "x") == NOT_LEADER


def test_a_new_leader_does_not_enqueue_a_tick_the_old_one_did(make_loop: MakeLoop,
                                                              r: redis.Redis) -> None:
    clock = FakeClock(epoch("2026-06-01T10:00:59+00:00"))
    entry = make_entry("* * * * *", "Minutely")
    first = make_loop([entry], clock)
    first.run_pass()
    clock.advance(1)
    assert first.run_pass() == 1
    first.stop()  # hands the lease over at the tick boundary
    second = make_loop([entry], clock)
    assert second.run_pass() == 0
    tick = epoch("2026-06-01T10:01:00+00:00")
    assert second.guard.claim(second.pool, entry, tick, "fire", "x") == DONE
    r.hdel("loops:Minutely", "tick")  # even with the mark gone, the guard key holds
    r.hset("loops:Minutely", "tick", tick - 60)
    assert second.guard.claim(second.pool, entry, tick, "fire", "x") == DONE
    clock.advance(60)
    assert second.guard.claim(second.pool, entry, tick + 60, "fire", "y") == FIRED
    assert ticks(r) == [tick]


def test_the_loop_rides_out_a_redis_restart(make_loop: MakeLoop) -> None:
    server = start_redis()
    cfg = Config(redis_url=server.url, log_level="warning", redis_retry_attempts=1)
    client = server.client()
    try:
        clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
        loop = make_loop([make_entry("* * * * *", "Minutely")], clock, cfg=cfg, start=True)
        # Its first pass registers the entry and reads the clock: only then is
        # the next minute's tick the one it waits for.
        wait_for(lambda: client.exists("loops:Minutely"), timeout=10, what="registered")
        clock.advance(60)
        wait_for(lambda: client.llen("queue:default") == 1, timeout=10, what="first tick")
        server.stop()
        clock.advance(60)  # a tick that falls during the outage
        wait_for(lambda: loop.service.failures >= 2, timeout=10, what="failed passes")
        server = start_redis(port=server.port)  # back, and empty
        client.close()
        client = server.client()
        wait_for(lambda: client.exists("loops:Minutely"), timeout=20, what="registered again")
        wait_for(loop.lease.is_leader, timeout=10, what="leader again")
        clock.advance(60)
        wait_for(lambda: client.llen("queue:default") == 1, timeout=10, what="tick after")
        assert "periodic" not in threads.dead()
        loop.stop()
    finally:
        client.close()
        server.stop()
        close_runtime(cfg)


def test_client_middleware_runs_before_the_guard(make_loop: MakeLoop, r: redis.Redis,
                                                 config: Config) -> None:
    def odd_minutes_only(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                         call_next: Callable[[], Any]) -> None:
        if payload["args"] == ["boom"]:
            raise RuntimeError("refused")
        payload["seen_by_middleware"] = True
        if payload["periodic"]["tick"] // 60 % 2:
            call_next()

    config.client_middleware.append(odd_minutes_only)
    clock = FakeClock(epoch("2026-06-01T10:00:30+00:00"))
    loop = make_loop([make_entry("* * * * *", "Minutely"),
                      make_entry("* * * * *", "Broken", args=["boom"])], clock)
    loop.run_pass()
    for _ in range(4):
        clock.advance(60)
        loop.run_pass()
        loop.run_pass()  # a stopped tick is passed over, not tried again
    assert ticks(r) == [epoch(f"2026-06-01T10:0{m}:00+00:00") for m in (1, 3)]
    assert all(j["seen_by_middleware"] for j in pushed(r))
    assert r.hget("loops:Minutely", "tick") == str(epoch("2026-06-01T10:04:00+00:00"))
    assert r.hget("loops:Broken", "tick") == str(epoch("2026-06-01T10:00:30+00:00"))

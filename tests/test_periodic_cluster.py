"""Periodic jobs across competing processes: each tick enqueued exactly once.

Real processes (tests/periodic_support.py) each run a periodic loop on one
Redis, on a shared fast clock (a simulated minute per real second); the
tests kill -9 and SIGSTOP the leader on the way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from periodic_support import FastClock
from waiting import wait_for

SUPPORT = Path(__file__).with_name("periodic_support.py")
SPEED = 60.0
BASE = 1_800_000_000.0 - 20  # a little before a minute boundary


class Fleet:
    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.t0 = time.time()
        self.clock = FastClock(BASE, self.t0, SPEED)
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, *, stale: bool = False, ttl: float = 1.0) -> subprocess.Popen[str]:
        log = self.logs / f"periodic-{len(self.procs)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SUPPORT), self.url, str(BASE), str(self.t0), str(SPEED),
                 str(ttl), "1" if stale else "0"],
                stdout=out, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(proc)
        return proc

    def log_of(self, proc: subprocess.Popen[str]) -> str:
        return (self.logs / f"periodic-{self.procs.index(proc)}.log").read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)


@pytest.fixture
def fleet(redis_server: Any, r: redis.Redis, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(redis_server.url, tmp_path)
    try:
        yield f
    finally:
        f.close()


def jobs(r: redis.Redis) -> list[dict[str, Any]]:
    raw = r.lrange("queue:default", 0, -1) + r.lrange("queue:other", 0, -1)
    return [json.loads(x) for x in raw]


def ticks_of(found: list[dict[str, Any]], name: str) -> list[int]:
    return sorted(j["periodic"]["tick"] for j in found if j["periodic"]["name"] == name)


def elected(fleet: Fleet, r: redis.Redis) -> float:
    """The fast clock's time once a process holds the periodic lease (process
    start-up takes seconds on a loaded machine, simulated minutes here)."""
    wait_for(lambda: r.exists("wurk:leader:periodic"), timeout=30, what="a periodic leader")
    return fleet.clock()


def assert_exactly_once(found: list[dict[str, Any]], begin: float, end: float) -> None:
    """Every tick of both entries from the first to ``end`` is there once, the
    first no later than its first due time after a leader was ``elected``."""
    for name, step in (("minutely", 60), ("two-minutely", 120)):
        ticks = ticks_of(found, name)
        assert len(ticks) == len(set(ticks)), f"{name}: a tick enqueued twice: {ticks}"
        assert ticks, f"{name}: nothing enqueued"
        assert ticks == list(range(ticks[0], ticks[-1] + 1, step)), f"{name}: a gap: {ticks}"
        assert ticks[0] <= begin + step + 5 * SPEED, f"{name}: started late: {ticks}"
        assert ticks[-1] >= end - step - 3 * SPEED, f"{name}: stopped early: {ticks}"


def pushers(found: list[dict[str, Any]]) -> set[int]:
    return {int(j["pushed_by"]) for j in found}


def last_pusher(r: redis.Redis) -> int:
    return int(json.loads(r.lindex("queue:default", 0))["pushed_by"])


def test_four_competing_processes_enqueue_every_tick_once(fleet: Fleet,
                                                          r: redis.Redis) -> None:
    for _ in range(4):
        fleet.spawn()
    begin = elected(fleet, r)
    wait_for(lambda: len(ticks_of(jobs(r), "minutely")) >= 12, timeout=30)
    end = fleet.clock()
    fleet.close()
    found = jobs(r)
    assert_exactly_once(found, begin, end)
    history = r.lrange("loop-history:minutely", 0, -1)
    assert len(history) == min(25, len(ticks_of(found, "minutely")))
    fired_at, jid = json.loads(history[0])
    assert jid in {j["jid"] for j in found} and isinstance(fired_at, int)


def test_kill_9_of_the_leader_loses_and_doubles_no_tick(fleet: Fleet, r: redis.Redis) -> None:
    for _ in range(3):
        fleet.spawn()
    begin = elected(fleet, r)
    wait_for(lambda: len(ticks_of(jobs(r), "minutely")) >= 4, timeout=30)
    leader = last_pusher(r)
    os.kill(leader, signal.SIGKILL)
    before = len(ticks_of(jobs(r), "minutely"))
    wait_for(lambda: len(ticks_of(jobs(r), "minutely")) >= before + 5, timeout=30)
    end = fleet.clock()
    fleet.close()
    found = jobs(r)
    assert_exactly_once(found, begin, end)
    assert leader in pushers(found) and len(pushers(found)) >= 2


def test_a_leader_stopped_past_its_lease_enqueues_nothing_after_it_resumes(
        fleet: Fleet, r: redis.Redis) -> None:
    # Both processes keep believing they lead once elected (the worst case);
    # only the fence in the tick script stands between the old leader and a
    # second enqueue.
    first = fleet.spawn(stale=True)
    begin = elected(fleet, r)
    wait_for(lambda: len(ticks_of(jobs(r), "minutely")) >= 2, timeout=30)
    fleet.spawn(stale=True)
    time.sleep(1.0)
    assert last_pusher(r) == first.pid
    first.send_signal(signal.SIGSTOP)
    wait_for(lambda: last_pusher(r) != first.pid, timeout=30)
    seen = {j["jid"] for j in jobs(r)}
    first.send_signal(signal.SIGCONT)
    count = len(ticks_of(jobs(r), "minutely"))
    wait_for(lambda: len(ticks_of(jobs(r), "minutely")) >= count + 4, timeout=30)
    end = fleet.clock()
    fleet.close()
    found = jobs(r)
    assert_exactly_once(found, begin, end)
    after = [j for j in found if j["jid"] not in seen]
    assert after and all(j["pushed_by"] != first.pid for j in after)
    assert "periodic.fenced" in fleet.log_of(first)  # it tried, and Redis refused it

"""Limiters across real processes: the limit holds under load, and a killed holder's
slot comes back after its lease."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
from conftest import RedisServer
from waiting import wait_for

import wurk
from wurk.limiter import OverLimit
from wurk.settings.config import Config

# Counts holders inside the critical section and keeps the highest count seen.
ENTER = """
local now = redis.call("incr", KEYS[1])
if now > tonumber(redis.call("get", KEYS[2]) or "0") then redis.call("set", KEYS[2], now) end
return now
"""


def run_forked(count: int, body: Callable[[int], None]) -> list[int]:
    """Fork ``count`` children running ``body(index)``; their exit statuses (0: no error)."""
    pids = []
    for index in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 1
            try:
                body(index)
                status = 0
            finally:
                os._exit(status)
        pids.append(pid)
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def in_threads(count: int, work: Callable[[], None]) -> None:
    """Run ``work`` in ``count`` threads; raise if any of them failed."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_fifty_threads_in_two_processes_never_exceed_five_holders(
        redis_server: RedisServer, r: redis.Redis) -> None:
    rounds = 3
    # Built before the fork, as a module-level limiter is in a swarm's children.
    limiter = wurk.limiter.concurrent("stripe", 5, lease=30, wait_timeout=40,
                                      config=Config(redis_url=redis_server.url))

    def child(index: int) -> None:
        client = redis_server.client()
        enter = client.register_script(ENTER)

        def work() -> None:
            for _ in range(rounds):
                with limiter.acquire():
                    enter(keys=["inside", "most"])
                    time.sleep(0.005)
                    client.decr("inside")
                client.incr("done")

        in_threads(25, work)

    assert run_forked(2, child) == [0, 0]
    assert int(r.get("done") or 0) == 2 * 25 * rounds  # every thread got through
    assert int(r.get("most") or 0) == 5
    assert r.get("inside") == "0"
    assert r.zcard("lmtr-cs:stripe") == 0  # every slot released


def test_a_killed_holder_frees_its_slot_after_the_lease(redis_server: RedisServer,
                                                        r: redis.Redis, config: Config) -> None:
    lease = 1.5
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child holds the slot until killed
        try:
            cfg = Config(redis_url=redis_server.url)
            limiter = wurk.limiter.concurrent("legacy-db", 1, lease=lease, config=cfg)
            permit = limiter.wait()
            redis_server.client().set("held_at", repr(permit.at))
            time.sleep(60)
        finally:
            os._exit(1)
    held_at = float(wait_for(lambda: r.get("held_at"), what="the child holds the slot"))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    limiter = wurk.limiter.concurrent("legacy-db", 1, lease=lease, wait_timeout=0)
    refused_at = float(r.time()[0]) + r.time()[1] / 1e6
    if refused_at - held_at < lease - 0.2:  # still within the lease: refused
        with pytest.raises(OverLimit):
            limiter.wait()
    permit = limiter.wait(wait_timeout=10)
    assert permit.at - held_at >= lease
    permit.release()
    assert r.hget("lmtr-stats:legacy-db", "reclaimed") == "1"


def admissions_per_kind(redis_server: RedisServer, kind: str, seconds: float) -> list[float]:
    """Two processes of four threads each take ``kind`` (5 per 1 s) for ``seconds``;
    the Redis times of every admission, sorted."""

    def child(index: int) -> None:
        cfg = Config(redis_url=redis_server.url)
        limiter: Any = getattr(wurk.limiter, kind)("partner", 5, interval=1, wait_timeout=5,
                                                   config=cfg)
        client = redis_server.client()
        until = time.monotonic() + seconds

        def work() -> None:
            while time.monotonic() < until:
                client.rpush("admitted", repr(limiter.wait().at))

        in_threads(4, work)

    assert run_forked(2, child) == [0, 0]
    with redis_server.client() as client:
        return sorted(float(at) for at in client.lrange("admitted", 0, -1))


def test_window_counts_never_exceed_the_limit_in_any_second(redis_server: RedisServer,
                                                            r: redis.Redis) -> None:
    ats = admissions_per_kind(redis_server, "window", 2.5)
    assert len(ats) >= 10
    most = max(sum(1 for a in ats if at - 1 < a <= at) for at in ats)
    assert most == 5


def test_bucket_counts_never_exceed_the_limit_per_interval(redis_server: RedisServer,
                                                           r: redis.Redis) -> None:
    ats = admissions_per_kind(redis_server, "bucket", 2.5)
    per_interval: dict[int, int] = {}
    for at in ats:
        per_interval[int(at // 1)] = per_interval.get(int(at // 1), 0) + 1
    assert len(per_interval) >= 2
    assert max(per_interval.values()) == 5


def test_leaky_admits_no_more_than_capacity_plus_drain(redis_server: RedisServer,
                                                       r: redis.Redis) -> None:
    ats = admissions_per_kind(redis_server, "leaky", 2.5)
    assert len(ats) >= 10
    # Any stretch [a_i, a_j] holds at most the capacity plus what drained meanwhile.
    excess = max(j - i + 1 - (5 + 5 * (ats[j] - ats[i]))
                 for i in range(len(ats)) for j in range(i, len(ats)))
    assert excess <= 0.01


def test_a_frozen_holder_loses_its_slot_after_the_lease_and_its_late_release_is_counted(
        redis_server: RedisServer, r: redis.Redis, config: Config) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: hold, get frozen, release late
        status = 1
        try:
            client = redis_server.client()
            limiter = wurk.limiter.concurrent("frozen", 1, lease=1.0,
                                              config=Config(redis_url=redis_server.url))
            permit = limiter.wait()
            client.set("held_at", repr(permit.at))
            wait_for(lambda: client.get("go"), timeout=30)
            permit.release()
            status = 0
        finally:
            os._exit(status)
    held_at = float(wait_for(lambda: r.get("held_at"), what="the child holds the slot"))
    os.kill(pid, signal.SIGSTOP)
    try:
        permit = wurk.limiter.concurrent("frozen", 1, lease=30).wait(wait_timeout=10)
        assert permit.at - held_at >= 1.0
    finally:
        r.set("go", "1")
        os.kill(pid, signal.SIGCONT)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert r.hgetall("lmtr-stats:frozen") == {"reclaimed": "1", "overages": "1"}
    assert r.zrange("lmtr-cs:frozen", 0, -1) == [permit.member]  # the late release freed nothing


LIMITED_JOBS = """
import os

import redis

import wurk

_r = redis.Redis.from_url(os.environ["REDIS_URL"])
GATE = wurk.limiter.concurrent("gate", 1, wait_timeout=0, backoff=lambda overrated: 0.3)


@wurk.job(name="lim_guarded")
def guarded(value):
    with GATE.acquire():
        _r.rpush("lim:done", str(value))
"""


def test_wurk_run_reschedules_a_job_over_the_limit_and_runs_it_later(
        redis_server: RedisServer, r: redis.Redis, config: Config, tmp_path: Path) -> None:
    (tmp_path / "limjobs.py").write_text(LIMITED_JOBS)
    held = wurk.limiter.concurrent("gate", 1).wait()
    _, raw = cli_workers.push(r, "lim_guarded", 42)
    r.lpush("queue:default", raw.replace('"retry": true', '"retry": true, "retry_count": 2'))
    r.lrem("queue:default", 1, raw)
    worker = cli_workers.Worker(["-r", "limjobs", "--log-level", "info"],
                                cli_workers.child_env(redis_server.url, tmp_path), tmp_path)
    try:
        def rescheduled() -> dict[str, Any] | None:
            assert worker.alive(), worker.stderr()
            entries = r.zrange("schedule", 0, -1)
            return json.loads(entries[0]) if entries else None

        payload = wait_for(rescheduled, timeout=30, what="the job in the schedule set")
        assert payload["overrated"] >= 1 and payload["retry_count"] == 2
        assert r.zcard("retry") == 0
        held.release()
        wait_for(lambda: r.lrange("lim:done", 0, -1) == ["42"], what="the job ran")
        assert r.zcard("retry") == r.zcard("schedule") == r.zcard("dead") == 0
        events = [e["event"] for e in worker.events()]
        assert "job.over_limit" in events and "job.fail" not in events
    finally:
        worker.close()

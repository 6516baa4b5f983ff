"""wurk.wire.kept_writes: writes Redis refused, kept and sent again in batches
until they land or their time is up; bounded with one log line, flushed
within a deadline, and none of them in a forked child. Real redis-server."""

from __future__ import annotations

import os
import time

import pytest
import redis
from structlog.testing import capture_logs
from waiting import wait_for

from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import kept_writes
from wurk.wire.kept_writes import KeptWrites
from wurk.wire.lua import UNIQUE_RELEASE, Script

UNREACHABLE = "redis://127.0.0.1:9/0"
# Sets its key: the tests see each write land.
MARK = Script("test_mark", 'redis.call("set", KEYS[1], ARGV[1]) return 1')


def later(seconds: float = 60.0) -> float:
    return time.monotonic() + seconds


def test_writes_kept_for_an_unreachable_redis_wait_and_the_cap_drops_the_oldest_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kept = KeptWrites()
    kept.service.stop()  # stopped before it started: no sender thread for this one
    monkeypatch.setattr(kept_writes, "MAX_KEPT", 3)
    pool = runtime_for(Config(redis_url=UNREACHABLE, redis_retry_attempts=1)).pool
    with capture_logs() as logs:
        for n in range(6):
            kept.keep(pool, UNIQUE_RELEASE, [f"unique:{n}"], [f"jid{n}"], until=later(),
                      what="test")
        kept.keep(pool, UNIQUE_RELEASE, ["unique:5"], ["jid5"], until=later(), what="test")
    assert kept.pending() == 3  # the same write kept twice is held once
    drops = [e for e in logs if e["event"] == "kept_writes.dropped"]
    assert len(drops) == 1 and drops[0]["keys"] == ["unique:0"]
    assert not kept.flush(later(5))  # Redis is away: all three stay
    assert kept.pending() == 3
    kept.forget_after_fork()
    assert kept.pending() == 0


def test_kept_writes_land_in_one_pass_and_expired_ones_are_dropped(
        config: Config, r: redis.Redis) -> None:
    kept, pool = KeptWrites(), runtime_for(config).pool
    kept.service.stop()
    for n in range(1200):  # more than one pipeline's worth
        kept.keep(pool, MARK, [f"mark:{n}"], [n], until=later(), what="test")
    kept.keep(pool, MARK, ["mark:late"], ["x"], until=time.monotonic() - 1, what="test")
    with capture_logs() as logs:
        assert kept.flush()
    assert r.get("mark:0") == "0" and r.get("mark:1199") == "1199"
    assert not r.exists("mark:late")
    assert [e["writes"] for e in logs if e["event"] == "kept_writes.landed"] == [1200]


def test_a_write_refused_with_an_error_reply_stays_until_its_time_is_up(
        config: Config, r: redis.Redis) -> None:
    kept, pool = KeptWrites(), runtime_for(config).pool
    kept.service.stop()
    r.hset("mark:hash", "not", "a string")
    strict = Script("test_strict", 'return redis.call("incr", KEYS[1])')
    kept.keep(pool, strict, ["mark:hash"], [], until=time.monotonic() + 0.5, what="test")
    assert not kept.flush() and kept.pending() == 1
    wait_for(kept.flush, timeout=10, what="dropped once its time was up")
    assert r.hgetall("mark:hash") == {"not": "a string"}


def test_the_service_sends_a_write_as_soon_as_redis_takes_it(
        config: Config, r: redis.Redis) -> None:
    kept, pool = KeptWrites(), runtime_for(config).pool
    try:
        kept.keep(pool, MARK, ["mark:now"], ["1"], until=later(), what="test")
        wait_for(lambda: r.get("mark:now") == "1", timeout=10, what="the service's pass")
        wait_for(lambda: kept.pending() == 0, timeout=10)
    finally:
        kept.service.stop(5)


def test_a_forked_child_keeps_none_of_its_parents_writes() -> None:
    pool = runtime_for(Config(redis_url=UNREACHABLE, redis_retry_attempts=1)).pool
    kept_writes.KEPT.service.stop()  # the test's process sends nothing
    kept_writes.keep(pool, UNIQUE_RELEASE, ["unique:fork"], ["jid"], until=later(),
                     what="test")
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it kept, and go
            os.close(read)
            os.write(write, str(kept_writes.KEPT.pending()).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as child:
            assert child.read() == "0"
        os.waitpid(pid, 0)
        assert kept_writes.KEPT.pending() == 1
    finally:
        kept_writes.KEPT.forget_after_fork()

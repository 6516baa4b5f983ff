"""Limiters in one process: arguments, each kind's check, Redis format, garbage state."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from typing import Any

import pytest
import redis
from conftest import RedisServer, start_redis

import wurk
from wurk.api import LimiterSet, UnknownLimiterError
from wurk.limiter import LimiterArgumentError, LimiterStateError, OverLimit, Permit
from wurk.limiter import base as limiter_base
from wurk.limiter import kinds as limiter_kinds
from wurk.limiter.policy import (
    POLL_MAX,
    POLL_MIN,
    overrated_count,
    poll_pause,
    reschedule_delay,
)
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.settings.config import Config
from wurk.wire.limiter_lua import CONCURRENT_ACQUIRE, WINDOW_ACQUIRE

KINDS = ("concurrent", "window", "bucket", "leaky")


def make(kind: str, name: str, limit: int, **options: Any) -> Any:
    if kind == "concurrent":
        options.pop("interval", None)
    return getattr(wurk.limiter, kind)(name, limit, **options)


# -- arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", " ", "a b", "a/b", "é", "x" * 201, None, 5, b"abc"])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_names_are_refused(kind: str, name: Any) -> None:
    with pytest.raises(LimiterArgumentError, match="name"):
        make(kind, name, 5)


@pytest.mark.parametrize("limit", [0, -1, 1.5, math.nan, math.inf, True, "5", None, 10**10])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_limits_are_refused(kind: str, limit: Any) -> None:
    with pytest.raises(LimiterArgumentError, match="limit"):
        make(kind, "ok", limit)


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, -math.inf, "fortnight", True,
                                   None, 10**9])
@pytest.mark.parametrize(("kind", "option"), [("window", "interval"), ("bucket", "interval"),
                                              ("leaky", "interval"), ("concurrent", "lease")])
def test_bad_durations_are_refused(kind: str, option: str, value: Any) -> None:
    with pytest.raises(LimiterArgumentError, match=option):
        make(kind, "ok", 5, **{option: value})


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, "soon", 7200])
def test_bad_wait_timeouts_are_refused(value: Any) -> None:
    with pytest.raises(LimiterArgumentError, match="wait_timeout"):
        wurk.limiter.window("ok", 5, wait_timeout=value)


def test_bad_reschedule_caps_and_backoffs_are_refused() -> None:
    with pytest.raises(LimiterArgumentError, match="reschedule"):
        wurk.limiter.bucket("ok", 5, reschedule=-1)
    with pytest.raises(TypeError, match="backoff"):
        wurk.limiter.bucket("ok", 5, backoff=30)  # type: ignore[arg-type]


def test_good_arguments_and_interval_names() -> None:
    assert wurk.limiter.window("a-b:c.d#e@f_1", 1, interval="minute").interval == 60.0
    assert wurk.limiter.bucket("x" * 200, 10**9, interval=0.5, wait_timeout=0).limit == 10**9
    assert wurk.limiter.leaky("x", 3, interval="day").rate == 3 / 86_400


# -- pure rules ---------------------------------------------------------------------------
def test_poll_pause_backs_off_and_never_spins() -> None:
    rng = random.Random(1)
    pauses = [poll_pause(attempt, None, rng) for attempt in range(1, 40)]
    assert all(POLL_MIN / 2 <= p <= POLL_MAX for p in pauses)
    assert max(pauses[:2]) < min(pauses[10:])  # it grows
    assert POLL_MIN <= poll_pause(1, 0.0, rng) <= 2 * POLL_MIN  # a hint of 0 still sleeps
    assert 0.7 <= poll_pause(1, 0.7, rng) <= 0.7 + POLL_MIN
    assert poll_pause(1, math.nan, rng) <= POLL_MIN  # a hint that is no number is ignored


def test_reschedule_delay_is_sidekiq_enterprises_formula() -> None:
    rng = random.Random(3)
    delays = [reschedule_delay(2, rng) for _ in range(2000)]
    assert min(delays) == 601 and max(delays) == 900  # 300 * 2 + rand(300) + 1


@pytest.mark.parametrize(("value", "count"), [(None, 0), (3, 3), (3.0, 3), ("3", 0), (True, 0),
                                              (-1, 0), (math.nan, 0), (math.inf, 10_001),
                                              (10**400, 10_001), (2.5, 2), ([], 0)])
def test_overrated_count_trusts_nothing(value: Any, count: int) -> None:
    assert overrated_count(value) == count


# -- each kind against Redis ----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_admits_the_limit_then_refuses(config: Config, kind: str) -> None:
    limiter = make(kind, f"k-{kind}", 3, interval=60, wait_timeout=0)
    permits = [limiter.try_acquire() for _ in range(3)]
    assert all(isinstance(p, Permit) for p in permits)
    assert limiter.try_acquire() is None
    with pytest.raises(OverLimit, match=f"'k-{kind}' \\({kind}\\)") as caught, \
            limiter.acquire():
        pass
    assert caught.value.limiter is limiter


def test_concurrent_release_frees_the_slot(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.concurrent("db", 1, lease=60, wait_timeout=0)
    with limiter.acquire() as permit:
        assert r.zcard("lmtr-cs:db") == 1
        assert 59 < r.zscore("lmtr-cs:db", permit.member) - permit.at <= 60  # type: ignore[operator]
        assert limiter.try_acquire() is None
    assert r.zcard("lmtr-cs:db") == 0
    assert limiter.try_acquire() is not None


def test_renew_extends_a_live_lease_only(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.concurrent("renew", 2, lease=0.3)
    permit = limiter.wait()
    r.zadd("lmtr-cs:renew", {permit.member: permit.at + 0.05})  # nearly run out
    assert permit.renew()
    assert r.zscore("lmtr-cs:renew", permit.member) > permit.at + 0.25  # type: ignore[operator]
    r.zadd("lmtr-cs:renew", {permit.member: 1.0})  # run out long ago
    assert not permit.renew()
    with pytest.raises(TypeError, match="no lease"):
        wurk.limiter.window("w", 1).wait().renew()


def test_an_expired_holder_is_reclaimed_and_its_late_release_counted(
        config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.concurrent("late", 1, lease=60, wait_timeout=0)
    permit = limiter.wait()
    r.zadd("lmtr-cs:late", {permit.member: 1.0})  # its lease ran out
    other = limiter.try_acquire()
    assert other is not None
    permit.release()
    assert r.hgetall("lmtr-stats:late") == {"reclaimed": "1", "overages": "1"}
    assert r.zrange("lmtr-cs:late", 0, -1) == [other.member]


@pytest.mark.parametrize(("script", "key", "args"), [
    (CONCURRENT_ACQUIRE, ["lmtr-cs:rp", "lmtr-stats:rp"], [1, 30]),
    (WINDOW_ACQUIRE, ["lmtr-w:rp"], [1, 30]),
])
def test_a_replayed_check_takes_no_second_slot(config: Config, script: Any, key: list[str],
                                               args: list[Any]) -> None:
    all_keys = [*key, "lmtr:rp", "lmtr-list"]
    head = ["0", "rp", "x", "{}", 60]
    run = runtime_for(config).pool.run
    first = run(lambda c: script.run(c, all_keys, [*head, *args, "m1"]))
    again = run(lambda c: script.run(c, all_keys, [*head, *args, "m1"]))
    other = run(lambda c: script.run(c, all_keys, [*head, *args, "m2"]))
    assert (first[0], again[0], other[0]) == (1, 1, 0)


def test_bucket_counts_per_epoch_key_in_sidekiq_format(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.bucket("mail", 5, interval=3600)
    permit = limiter.wait()
    key = f"lmtr-b:mail:{int(permit.at // 3600)}"
    assert r.get(key) == "1"
    assert 3600 < r.ttl(key) <= 7201


@pytest.mark.parametrize("skew", [-3600.0, 0.0, 3600.0, 5 * 3600.0, -50 * 3600.0])
def test_bucket_counts_on_redis_clock_whatever_this_hosts_says(
        config: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    real = time.time
    monkeypatch.setattr(limiter_kinds.time, "time", lambda: real() + skew)
    limiter = wurk.limiter.bucket("skew:12", 5, interval=3600)
    first, second = limiter.wait(), limiter.wait()
    epoch = int(first.at // 3600)
    if epoch == int(second.at // 3600):  # not straddling an hour
        assert r.keys("lmtr-b:*") == [f"lmtr-b:skew:12:{epoch}"]
        assert r.get(f"lmtr-b:skew:12:{epoch}") == "2"


def test_leaky_stores_level_and_last(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.leaky("sms", 2, interval=10)
    first = limiter.wait()
    stored = r.hgetall("lmtr-l:sms")
    assert float(stored["level"]) == 1.0 and float(stored["last"]) == pytest.approx(first.at)
    second = limiter.wait()
    assert 1.9 < second.used <= 2.0
    assert limiter.try_acquire() is None


def test_the_first_check_registers_the_limiter(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.concurrent("stripe", 5, lease=30, wait_timeout=2)
    assert not r.exists("lmtr:stripe")
    with limiter.acquire():
        pass
    assert r.smembers("lmtr-list") == {"stripe"}
    assert r.hget("lmtr:stripe", "type") == "concurrent"
    assert json.loads(r.hget("lmtr:stripe", "options") or "") == {
        "limit": 5, "lock_timeout": 30, "wait_timeout": 2, "ttl": 7_776_000}
    assert 7_776_000 - 5 < r.ttl("lmtr:stripe") <= 7_776_000
    r.delete("lmtr:stripe")
    limiter.wait().release()
    assert not r.exists("lmtr:stripe")  # once, not at every check


def test_a_waiting_acquire_sleeps_between_checks(config: Config,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    clock = [0.0]

    def fake_sleep(seconds: float) -> None:
        pauses.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(limiter_base.time, "sleep", fake_sleep)
    monkeypatch.setattr(limiter_base.time, "monotonic", lambda: clock[0])
    limiter = wurk.limiter.concurrent("busy", 1, wait_timeout=3)
    held = limiter.wait()
    with pytest.raises(OverLimit):
        limiter.wait()
    assert sum(pauses) == pytest.approx(3.0)
    assert all(p >= POLL_MIN / 2 for p in pauses) and len(pauses) < 40
    held.release()


# -- garbage in Redis ---------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "key"), [("concurrent", "lmtr-cs:g"), ("window", "lmtr-w:g"),
                                           ("leaky", "lmtr-l:g"), ("concurrent", "lmtr:g")])
def test_a_wrong_type_key_is_a_clear_error(config: Config, r: redis.Redis, kind: str,
                                           key: str) -> None:
    r.rpush(key, "junk")
    limiter = make(kind, "g", 3)
    with pytest.raises(LimiterStateError, match=f"limiter 'g': {key} holds a list"):
        limiter.try_acquire()
    assert r.lrange(key, 0, -1) == ["junk"]  # nothing written


@pytest.mark.parametrize("value", ["many", "2.5", "-1", "inf", "nan"])
def test_a_bucket_counter_that_is_no_count_is_a_clear_error(config: Config, r: redis.Redis,
                                                            value: str) -> None:
    limiter = wurk.limiter.bucket("g", 3, interval=3600)
    permit = limiter.wait()
    r.set(f"lmtr-b:g:{int(permit.at // 3600)}", value)
    with pytest.raises(LimiterStateError, match="not a count"):
        limiter.try_acquire()


@pytest.mark.parametrize("fields", [{"level": "lots", "last": "1"}, {"level": "1"},
                                    {"level": "nan", "last": "1"}])
def test_a_leaky_level_that_is_no_number_is_a_clear_error(config: Config, r: redis.Redis,
                                                          fields: dict[str, str]) -> None:
    r.hset("lmtr-l:g", mapping=fields)
    with pytest.raises(LimiterStateError, match="not a number"):
        wurk.limiter.leaky("g", 3).try_acquire()


def test_reset_cures_garbage(config: Config, r: redis.Redis) -> None:
    limiter = wurk.limiter.window("cure", 3)
    limiter.wait()
    r.delete("lmtr-w:cure")
    r.set("lmtr-w:cure", "junk")
    with pytest.raises(LimiterStateError, match="wurk limiters reset cure"):
        limiter.try_acquire()
    assert LimiterSet(config=config).reset("cure") == 1
    assert limiter.try_acquire() is not None
    with pytest.raises(UnknownLimiterError):
        LimiterSet(config=config).reset("never")


# -- the admin API -------------------------------------------------------------------------
def test_the_api_lists_every_limiter_and_survives_garbage(config: Config,
                                                          r: redis.Redis) -> None:
    for kind in KINDS:
        limiter = make(kind, f"api-{kind}", 4, interval=60)
        limiter.wait()
        limiter.wait()
    r.sadd("lmtr-list", "gone", "bad name", "junk-meta", "junk-options", "ruby-bucket")
    r.set("lmtr:junk-meta", "x")
    r.hset("lmtr:junk-options", mapping={"type": "window", "options": "[1"})
    r.hset("lmtr:ruby-bucket", mapping={"type": "bucket",
                                        "options": '{"count":9,"interval":"minute"}'})
    found = {info.name: info for info in LimiterSet(config=config)}
    assert {n: (found[n].kind, found[n].limit, found[n].used) for n in found
            if n.startswith("api-") and n != "api-leaky"} == {
        "api-concurrent": ("concurrent", 4, 2), "api-window": ("window", 4, 2),
        "api-bucket": ("bucket", 4, 2)}
    assert 1.9 < (found["api-leaky"].used or 0) <= 2
    assert found["api-concurrent"].options == {"limit": 4, "lock_timeout": 30}
    assert found["ruby-bucket"].limit == 9 and found["ruby-bucket"].error is None
    for name in ("gone", "bad name", "junk-meta", "junk-options"):
        assert found[name].error and found[name].kind is None
    assert LimiterSet(config=config).get("api-window").used == 2
    with pytest.raises(UnknownLimiterError):
        LimiterSet(config=config).get("nope")
    LimiterSet(config=config).delete("junk-meta")
    assert "junk-meta" not in LimiterSet(config=config).names()


def test_redis_away_is_an_error_and_a_restarted_redis_works_again(
        own_redis: RedisServer) -> None:
    cfg = Config(redis_url=own_redis.url, redis_retry_attempts=2, redis_retry_base=0.01,
                 redis_retry_cap=0.02)
    limiter = wurk.limiter.concurrent("outage", 2, config=cfg)
    limiter.wait().release()
    own_redis.stop()
    with pytest.raises(redis.ConnectionError):
        limiter.try_acquire()
    restarted = start_redis(port=own_redis.port)
    try:
        permit = limiter.wait()  # the script is loaded again (NOSCRIPT) on the new server
        assert permit.used == 1
        permit.release()
    finally:
        restarted.stop()
        shutil.rmtree(restarted.workdir, ignore_errors=True)
        close_runtime(cfg)


def test_the_public_names() -> None:
    assert {"limiter", "OverLimit"} <= set(wurk.__all__)
    assert wurk.OverLimit is OverLimit
    assert wurk.limiter.concurrent.__module__ == "wurk.limiter"

"""wurk.api Stats and History, as Sidekiq's dashboard reads them (spec §8, §13)."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta

import pytest
import redis
from test_api_support import (
    RUBY_IDENTITY,
    RUBY_INFO,
    job_json,
    launched,
    recording_job,
    ruby_heartbeat,
)
from waiting import wait_for

import wurk
from wurk.api import History, Stats
from wurk.settings.config import Config


def test_fast_and_slow_counters(config: Config, r: redis.Redis) -> None:
    r.set("stat:processed", 7)
    r.set("stat:failed", 2)
    r.zadd("schedule", {job_json(): time.time() + 60})
    r.zadd("retry", {job_json(): 1.0, job_json(): 2.0})
    r.zadd("dead", {job_json(): 1.0, job_json(): 2.0, job_json(): 3.0})
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=3)
    r.sadd("processes", "ghost:1:deadbeef0000")  # crashed: no hash
    r.sadd("queues", "default", "other")
    r.lpush("queue:default", *[job_json(enqueued_at=time.time() - 20)] * 5)
    r.lpush("queue:other", job_json(), job_json())
    stats = Stats(config=config)
    assert (stats.processed, stats.failed) == (7, 2)
    assert (stats.scheduled_size, stats.retry_size, stats.dead_size) == (1, 2, 3)
    assert stats.processes_size == 2  # unpruned, as Sidekiq's SCARD
    assert stats.workers_size == 3
    assert stats.enqueued == 7
    assert stats.default_queue_latency == pytest.approx(20, abs=0.5)


def test_empty_redis_reads_as_zeros(config: Config) -> None:
    stats = Stats(config=config)
    assert (stats.processed, stats.failed, stats.enqueued, stats.workers_size) == (0, 0, 0, 0)
    assert stats.default_queue_latency == 0.0
    assert stats.queues() == {}


def test_stats_are_a_snapshot_until_refreshed(config: Config, r: redis.Redis) -> None:
    stats = Stats(config=config)
    r.set("stat:processed", 40)
    assert stats.processed == 0
    stats.refresh()
    assert stats.processed == 40


def test_queues_largest_first(config: Config, r: redis.Redis) -> None:
    r.sadd("queues", "a", "b", "c", "empty")
    r.lpush("queue:a", *["x"] * 2)
    r.lpush("queue:b", *["x"] * 9)
    r.lpush("queue:c", *["x"] * 4)
    assert list(Stats(config=config).queues().items()) == [("b", 9), ("c", 4), ("a", 2),
                                                           ("empty", 0)]


def test_reset_zeroes_named_counters_only(config: Config, r: redis.Redis) -> None:
    r.set("stat:processed", 10)
    r.set("stat:failed", 3)
    stats = Stats(config=config)
    stats.reset("failed")
    assert (r.get("stat:processed"), r.get("stat:failed")) == ("10", "0")
    assert stats.failed == 0
    stats.reset()
    assert (r.get("stat:processed"), r.get("stat:failed")) == ("0", "0")


def test_reset_refuses_an_unknown_name_and_writes_nothing(config: Config,
                                                          r: redis.Redis) -> None:
    r.set("stat:processed", 10)
    with pytest.raises(ValueError, match="'bogus'"):
        Stats(config=config).reset("processed", "bogus")
    assert r.get("stat:processed") == "10"


def test_history_reads_per_day_keys_with_missing_days_as_zero(config: Config,
                                                              r: redis.Redis) -> None:
    today = datetime.now(UTC).date()
    r.set(f"stat:processed:{today}", 5)
    r.set(f"stat:processed:{today - timedelta(days=2)}", 11)
    r.set(f"stat:failed:{today - timedelta(days=1)}", 1)
    history = History(3, config=config)
    assert list(history.processed.items()) == [
        (str(today), 5), (str(today - timedelta(days=1)), 0), (str(today - timedelta(days=2)), 11)]
    assert list(history.failed.values()) == [0, 1, 0]


def test_history_from_a_start_date_across_a_month_end(config: Config, r: redis.Redis) -> None:
    r.set("stat:processed:2028-02-29", 3)
    r.set("stat:processed:2028-03-01", 4)
    history = History(3, date(2028, 3, 1), config=config)
    assert history.processed == {"2028-03-01": 4, "2028-02-29": 3, "2028-02-28": 0}


@pytest.mark.parametrize("days", [0, 5 * 365 + 1])
def test_history_refuses_out_of_range_days(config: Config, days: int) -> None:
    with pytest.raises(ValueError, match="days"):
        History(days, config=config)


def test_counts_written_by_a_real_launcher(config: Config) -> None:
    with recording_job() as (ok, ok_runs):
        ok.perform_async(1)
        ok.perform_async(2)
        # An unknown class fails like any job; retry false keeps it out of the sets.
        wurk.Client(config).push({"class": "api_no_such_job", "args": [], "retry": False})
        with launched(config) as launcher:
            wait_for(lambda: len(ok_runs) == 2)
            wait_for(lambda: Stats(config=config).processed == 3)
            launcher.stop()
    stats = Stats(config=config)
    assert (stats.processed, stats.failed) == (3, 1)
    today = str(datetime.now(UTC).date())
    assert History(1, config=config).processed == {today: 3}
    assert History(1, config=config).failed == {today: 1}

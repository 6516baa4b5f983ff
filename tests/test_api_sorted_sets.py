"""wurk.api schedule, retry and dead sets, and moves between them (spec §3, §4, §6, §7)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from test_api_support import job_json, launched, race, recording_job
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.api import (
    DeadSet,
    JobKilledError,
    JobNotFoundError,
    RetrySet,
    ScheduledSet,
    SortedEntry,
    SortedSet,
)
from wurk.settings.config import Config
from wurk.wire.payload import PayloadError


def failed_job(jid: str, retry_count: int = 2, **extra: Any) -> str:
    """A retry entry as 6.4 writes it: failure fields appended (spec §6)."""
    return job_json(jid, bid="b-1", error_message="boom", error_class="RuntimeError",
                    failed_at=time.time() - 100, retry_count=retry_count,
                    retried_at=time.time() - 10, **extra)


def queued(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(v) for v in r.lrange(f"queue:{queue}", 0, -1)]


def dead_jids(r: redis.Redis) -> list[str]:
    return [json.loads(str(m))["jid"] for m in r.zrange("dead", 0, -1)]


def schedule(config: Config, n: int, at: float | None = None) -> list[str]:
    base = time.time() + 100
    return [wurk.Client(config).push({"class": "X", "args": [i],
                                      "at": at if at is not None else base + i})
            for i in range(n)]


# -- browsing ---------------------------------------------------------------
def test_scheduled_set_size_and_order_by_score(config: Config) -> None:
    jids = schedule(config, 3)
    scheduled = ScheduledSet(config=config)
    assert scheduled.size == len(scheduled) == 3
    entries = list(scheduled)
    assert [e.jid for e in entries] == jids
    assert all(isinstance(e, SortedEntry) for e in entries)
    assert entries[0].at == pytest.approx(time.time() + 100, abs=2)
    assert [e.jid for e in scheduled.entries(descending=True)] == jids[::-1]


def test_pages_of_equal_scores_yield_every_entry_once(config: Config) -> None:
    wurk.Client(config).push_bulk({"class": "X", "args": [[i] for i in range(130)],
                                   "at": time.time() + 100})
    scheduled = ScheduledSet(config=config)
    for descending in (False, True):
        seen = [e.args[0] for e in scheduled.entries(descending=descending)]
        assert sorted(seen) == list(range(130))


def test_deleting_while_iterating_skips_nothing(config: Config) -> None:
    schedule(config, 75)
    wurk.Client(config).push_bulk({"class": "X", "args": [[i] for i in range(60)],
                                   "at": time.time() + 50})
    scheduled = ScheduledSet(config=config)
    assert sum(entry.delete() for entry in scheduled) == 135
    assert scheduled.size == 0


def test_find_job_and_must_exist(config: Config) -> None:
    jids = schedule(config, 120)
    found = ScheduledSet(config=config).find_job(jids[77])
    assert found is not None and found.args == [77]
    assert ScheduledSet(config=config).find_job("f" * 24) is None
    with pytest.raises(JobNotFoundError, match="'schedule'"):
        ScheduledSet(config=config).find_job("f" * 24, must_exist=True)


def test_scan_matches_a_substring_literally(config: Config, r: redis.Redis) -> None:
    client = wurk.Client(config)
    for arg in ("needle-1", "hay", "needle-2", "a[b]c"):
        client.push({"class": "X", "args": [arg], "at": time.time() + 60})
    retries = ScheduledSet(config=config)
    assert sorted(e.args[0] for e in retries.scan("needle")) == ["needle-1", "needle-2"]
    assert [e.args[0] for e in retries.scan("a[b]")] == ["a[b]c"]
    assert [e.args[0] for e in retries.scan('*h?y*')] == ["hay"]  # a glob is used as given


def test_clear_removes_the_set(config: Config, r: redis.Redis) -> None:
    schedule(config, 3)
    ScheduledSet(config=config).clear()
    assert not r.exists("schedule")


def test_a_sorted_set_needs_a_name(config: Config) -> None:
    with pytest.raises(ValueError, match="key name"):
        SortedSet(config=config)
    assert SortedSet("retry", config=config).size == 0


# -- per-entry moves --------------------------------------------------------
def test_add_to_queue_pushes_now_and_removes_the_entry(config: Config, r: redis.Redis) -> None:
    [jid] = schedule(config, 1)
    entry = ScheduledSet(config=config).find_job(jid)
    assert entry is not None and entry.add_to_queue()
    assert r.zcard("schedule") == 0
    [job] = queued(r)
    assert job["jid"] == jid and job["args"] == [0]
    assert job["enqueued_at"] == pytest.approx(time.time(), abs=2)
    assert "at" not in job
    assert entry.add_to_queue() is False  # already moved: nothing pushed twice
    assert r.llen("queue:default") == 1


def test_reschedule_moves_the_score_and_never_resurrects(config: Config, r: redis.Redis) -> None:
    [jid] = schedule(config, 1)
    entry = ScheduledSet(config=config).find_job(jid)
    assert entry is not None
    target = time.time() + 5000.25
    assert entry.reschedule(target)
    assert entry.at == target
    assert r.zscore("schedule", entry.value) == target
    assert entry.delete()
    assert entry.delete() is False
    assert entry.reschedule(target + 1) is False
    assert r.zcard("schedule") == 0


def test_retry_decrements_retry_count_and_keeps_unknown_keys(config: Config,
                                                             r: redis.Redis) -> None:
    raw = failed_job("a" * 24, retry_count=2, queue="mail")
    r.zadd("retry", {raw: time.time() + 30})
    entry = RetrySet(config=config).find_job("a" * 24, must_exist=True)
    assert entry is not None and entry.has_error and entry.retry_count == 2
    assert entry.retry()
    assert r.zcard("retry") == 0
    [job] = queued(r, "mail")
    assert job["retry_count"] == 1
    assert (job["bid"], job["error_class"], job["queue"]) == ("b-1", "RuntimeError", "mail")
    assert job["created_at"] == json.loads(raw)["created_at"]
    assert "mail" in r.smembers("queues")


def test_kill_moves_to_dead_and_runs_death_handlers(config: Config, r: redis.Redis) -> None:
    calls: list[tuple[Mapping[str, Any], BaseException]] = []
    config.death_handlers.append(lambda job, exc: calls.append((job, exc)))
    raw = failed_job("b" * 24)
    r.zadd("retry", {raw: time.time() + 30})
    entry = RetrySet(config=config).find_job("b" * 24)
    assert entry is not None and entry.kill()
    assert r.zcard("retry") == 0
    assert r.zscore("dead", raw) == pytest.approx(time.time(), abs=2)  # byte for byte
    [(job, exc)] = calls
    assert job["jid"] == "b" * 24 and isinstance(exc, JobKilledError)
    assert entry.kill() is False  # already gone: no second handler call
    assert len(calls) == 1


def test_moving_an_unparseable_entry_refuses_and_leaves_it(config: Config,
                                                           r: redis.Redis) -> None:
    r.zadd("retry", {"not json at all": 5.0})
    [entry] = RetrySet(config=config)
    with pytest.raises(PayloadError):
        entry.retry()
    assert r.zcard("retry") == 1
    assert entry.kill()  # the morgue takes it as the raw string, as Sidekiq does
    assert r.zrange("dead", 0, -1) == ["not json at all"]


# -- set-level moves --------------------------------------------------------
def test_retry_all_and_kill_all_across_pages(config: Config, r: redis.Redis) -> None:
    r.zadd("retry", {failed_job(f"{i:024x}"): time.time() + i for i in range(70)})
    assert RetrySet(config=config).retry_all() == 70
    assert r.zcard("retry") == 0 and r.llen("queue:default") == 70
    assert {j["retry_count"] for j in queued(r)} == {1}
    r.zadd("retry", {failed_job(f"{i:024x}"): time.time() + i for i in range(60)})
    assert RetrySet(config=config).kill_all() == 60
    assert (r.zcard("retry"), r.zcard("dead")) == (0, 60)


def test_dead_set_retry_all_and_scheduled_add_all(config: Config, r: redis.Redis) -> None:
    r.zadd("dead", {failed_job(f"{i:024x}", retry_count=25): float(i) for i in range(55)})
    assert DeadSet(config=config).retry_all() == 55
    assert r.zcard("dead") == 0
    assert {j["retry_count"] for j in queued(r)} == {24}
    schedule(config, 3)
    assert ScheduledSet(config=config).add_all_to_queue() == 3
    assert r.llen("queue:default") == 58


def test_dead_set_kill_applies_size_and_age_caps(config: Config, r: redis.Redis) -> None:
    config = tuned(config, dead_max_jobs=3)
    dead = DeadSet(config=config)
    assert (dead.dead_max_jobs, dead.dead_timeout) == (3, config.dead_timeout)
    r.zadd("dead", {"ancient": time.time() - config.dead_timeout - 60})
    for i in range(5):
        dead.kill(job_json(f"{i:024x}"))
    # Sidekiq's ZREMRANGEBYRANK 0 -max keeps max - 1 (spec §7).
    assert r.zcard("dead") == 2
    assert "ancient" not in r.zrange("dead", 0, -1)
    assert [jid[-1] for jid in dead_jids(r)] == ["3", "4"]


def test_dead_set_kill_takes_raw_or_items_and_notifies_on_request(config: Config,
                                                                  r: redis.Redis) -> None:
    calls: list[Mapping[str, Any]] = []
    config.death_handlers.append(lambda job, exc: calls.append(job))
    raw = '{"class":"X","args":[],"jid":"keep   spacing"}'
    DeadSet(config=config).kill(raw)
    DeadSet(config=config).kill({"class": "Y", "args": [1], "jid": "j2"}, notify_failure=False)
    assert raw in r.zrange("dead", 0, -1)
    assert [c["jid"] for c in calls] == ["keep   spacing"]
    assert DeadSet(config=config).find_job("j2") is not None


# -- races and a real worker ------------------------------------------------
def test_racing_retries_push_exactly_once(config: Config, r: redis.Redis) -> None:
    for round_ in range(5):
        jid = f"{round_:024x}"
        r.zadd("retry", {failed_job(jid): time.time() + 30})
        entries = [RetrySet(config=config).find_job(jid, must_exist=True) for _ in range(8)]
        results = race(*(entry.retry for entry in entries if entry is not None))
        assert sorted(results) == [False] * 7 + [True]
        assert [j["jid"] for j in queued(r)].count(jid) == 1


def test_racing_kill_and_retry_leave_the_job_in_one_place(config: Config,
                                                          r: redis.Redis) -> None:
    for round_ in range(10):
        jid = f"{round_:024x}"
        r.zadd("retry", {failed_job(jid): time.time() + 30})
        killer, retrier = (RetrySet(config=config).find_job(jid) for _ in range(2))
        assert killer is not None and retrier is not None
        killed, retried = race(killer.kill, retrier.retry)
        assert killed != retried
        in_dead = jid in dead_jids(r)
        in_queue = any(j["jid"] == jid for j in queued(r))
        assert (in_dead, in_queue) == (killed, retried)


def test_kill_moves_only_its_own_entry_while_the_set_changes(
        config: Config, r: redis.Redis) -> None:
    r.zadd("retry", {failed_job("c" * 24): 10.0})
    entry = RetrySet(config=config).find_job("c" * 24, must_exist=True)
    assert entry is not None
    r.zadd("retry", {"unrelated": 1.0})  # another writer, between the read and the kill
    assert entry.kill()
    assert r.zrange("retry", 0, -1) == ["unrelated"]
    assert dead_jids(r) == ["c" * 24]


def test_kill_loses_cleanly_to_a_retry_that_took_the_entry_first(
        config: Config, r: redis.Redis) -> None:
    r.zadd("retry", {failed_job("d" * 24): 10.0})
    killer = RetrySet(config=config).find_job("d" * 24, must_exist=True)
    retrier = RetrySet(config=config).find_job("d" * 24, must_exist=True)
    assert killer is not None and retrier is not None
    assert retrier.retry()
    assert killer.kill() is False  # one script: removed and moved, or neither
    assert r.zcard("dead") == 0
    assert [j["jid"] for j in queued(r)] == ["d" * 24]


def test_retry_now_reruns_a_job_a_real_worker_failed(config: Config, r: redis.Redis) -> None:
    with recording_job(fail_times=1, retry=3) as (job, runs):
        jid = job.perform_async("x")
        with launched(config):
            entry = wait_for(lambda: RetrySet(config=config).find_job(jid))
            assert (entry.error_class, entry.retry_count) == ("RuntimeError", 0)
            assert entry.at > time.time() + 10  # the scheduler would wait 15 s or more
            assert entry.retry()
            wait_for(lambda: runs == [("x",)])
        assert r.zcard("retry") == 0

"""Unique jobs (wurk.unique.push, wurk.unique.step, wurk.unique.keys) against a
real redis-server: options, keys, duplicates, bulk, scheduled, garbage locks."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from tuning import tuned

import wurk
from wurk.push.client import Client
from wurk.redis.policy import ConnectError
from wurk.settings.config import Config
from wurk.unique import keys as unique
from wurk.unique.keys import canonical, lock_key
from wurk.unique.push import UniqueKeyError

Define = Callable[..., Any]


def locks(r: redis.Redis) -> list[str]:
    return sorted(r.scan_iter(match="unique:*"))


def queued(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(r.lrange(f"queue:{queue}", 0, -1))]


def nothing_written(r: redis.Redis) -> bool:
    return r.dbsize() == 0


# -- options -----------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "60", True, [60], 1e10])
def test_unique_for_must_be_a_positive_finite_number(bad: Any, config: Config,
                                                     r: redis.Redis) -> None:
    with pytest.raises(TypeError, match="unique_for must be a"):
        wurk.job(name="u_bad", unique_for=bad)
    with pytest.raises(TypeError, match="unique_for"):
        type("Bad", (wurk.Job,), {"perform": lambda self: None}, unique_for=bad)
    ok = wurk.job(name="u_bad_set")(lambda: None)
    with pytest.raises(TypeError, match="unique_for"):
        ok.set(unique_for=bad)
    wurk.registry.discard("u_bad_set")
    assert nothing_written(r)


def test_unique_until_and_unique_key_are_checked_when_given(define: Define) -> None:
    with pytest.raises(TypeError, match="unique_until must be one of success, start, expiry"):
        wurk.job(name="u_until", unique_for=5, unique_until="never")
    with pytest.raises(TypeError, match="unique_key must be a callable"):
        wurk.job(name="u_key", unique_for=5, unique_key="args[0]")
    job = define(lambda: None, unique_for=5)
    with pytest.raises(TypeError, match="unique_key is declared with the job"):
        job.set(unique_key=lambda args: "x")


def test_a_raw_push_with_a_bad_unique_for_writes_nothing(config: Config, r: redis.Redis) -> None:
    client = Client(config)
    for bad in ("60", -3, 0, [1]):
        with pytest.raises(TypeError, match="unique_for must be a positive finite number"):
            client.push({"class": "Raw", "args": [1], "unique_for": bad})
    assert nothing_written(r)
    # Sidekiq Enterprise's way to push one job without a lock.
    assert client.push({"class": "Raw", "args": [1], "unique_for": False})
    assert client.push({"class": "Raw", "args": [1], "unique_for": None})
    assert len(queued(r)) == 2 and locks(r) == []


# -- the lock a push takes -----------------------------------------------------
def test_a_duplicate_push_returns_none_and_the_lock_holds_the_jid(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda a, b: None, unique_for=30)
    jid = job.perform_async(1, {"b": 2, "a": [1.5, "é"]})
    assert jid is not None
    assert job.perform_async(1, {"a": [1.5, "é"], "b": 2}) is None  # equal JSON, other order
    key = lock_key(job.name, "default", [1, {"a": [1.5, "é"], "b": 2}])
    assert locks(r) == [key] and r.get(key) == jid
    assert 29_000 < r.pttl(key) <= 30_000
    [payload] = queued(r)
    assert payload["unique_for"] == 30 and payload["unique_lock"] == key
    assert "unique_until" not in payload  # the default travels as Sidekiq's does: absent
    assert job.perform_async(2, {}) is not None  # other arguments: another lock
    assert job.set(queue="other").perform_async(1, {"b": 2, "a": [1.5, "é"]}) is not None
    assert len(locks(r)) == 3


def test_canonical_json_sorts_keys_and_keeps_number_forms() -> None:
    assert canonical({"b": 1, "a": {"d": 1.0, "c": [1, 1e20, 0.1]}}) == \
        '{"a":{"c":[1,1.0e+20,0.1],"d":1.0},"b":1}'
    assert lock_key("J", "q", [1]) != lock_key("J", "q", [1.0])
    assert lock_key("J", "q", [{"x": 1, "y": 2}]) == lock_key("J", "q", [{"y": 2, "x": 1}])
    digest = hashlib.sha256('["J","q",["café"]]'.encode()).hexdigest()
    assert lock_key("J", "q", ["café"]) == f"unique:{digest}"


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby")
def test_the_digest_is_sidekiq_enterprises_for_sorted_hashes_and_ruby_floats() -> None:
    args = [1, 1.0, 0.1, 1e20, 1.5e-7, 123456789012345.0, "café ☕", "tab\there \u0001",
            {"a": None, "b": [True, False]}, -0.0, 10**20]
    script = ('require "json"; require "digest"; a = JSON.parse(STDIN.read); '
              'puts "unique:" + Digest::SHA256.hexdigest(JSON.dump(["Ruby::Job", "q", a]))')
    done = subprocess.run(["ruby", "-e", script], input=json.dumps(args), capture_output=True,
                          text=True, timeout=30, check=True)
    assert done.stdout.strip() == lock_key("Ruby::Job", "q", args)


def test_a_user_middleware_runs_first_and_the_lock_covers_its_arguments(
        config: Config, r: redis.Redis, define: Define) -> None:
    def scrub(job_class: str, payload: dict[str, Any], queue: str, pool: Any,
              call_next: Callable[[], Any]) -> None:
        payload["args"] = [payload["args"][0]]  # drops a request id
        call_next()

    config.client_middleware.append(scrub)
    job = define(lambda *a: None, unique_for=30)
    assert job.perform_async("x", "request-1") is not None
    assert job.perform_async("x", "request-2") is None
    assert locks(r) == [lock_key(job.name, "default", ["x"])]


def test_a_middleware_may_add_unique_for_and_the_lock_is_taken(
        config: Config, r: redis.Redis) -> None:
    def uniquely(job_class: str, payload: dict[str, Any], queue: str, pool: Any,
                 call_next: Callable[[], Any]) -> None:
        payload["unique_for"] = 10
        call_next()

    config.client_middleware.append(uniquely)
    client = Client(config)
    assert client.push({"class": "M", "args": [1]}) is not None
    assert client.push({"class": "M", "args": [1]}) is None


def test_a_key_function_replaces_the_arguments_in_the_key(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda user, note: None, unique_for=30, unique_key=lambda args: str(args[0]))
    assert job.perform_async(7, "first") is not None
    assert job.perform_async(7, "second") is None
    assert job.perform_async(8, "first") is not None
    assert locks(r) == sorted([lock_key(job.name, "default", "7"),
                               lock_key(job.name, "default", "8")])


class KeyedByUser(wurk.Job, unique_for=30, unique_key=lambda args: f"user-{args[0]}"):
    def perform(self, user: int, note: str) -> None: ...


def test_a_job_class_declares_the_options_too(config: Config, r: redis.Redis) -> None:
    assert KeyedByUser.perform_async(1, "a") is not None
    assert KeyedByUser.perform_async(1, "b") is None
    assert KeyedByUser.set(unique_for=None).perform_async(1, "c") is not None
    assert locks(r) == [lock_key(KeyedByUser.wurk_name, "default", "user-1")]


@pytest.mark.parametrize(("key", "error"), [
    (lambda args: 1 / 0, "raised ZeroDivisionError"),
    (lambda args: args[0], "must return a str, got int"),
])
def test_a_key_function_that_fails_pushes_nothing(key: Callable[[list[Any]], Any], error: str,
                                                  config: Config, r: redis.Redis,
                                                  define: Define) -> None:
    job = define(lambda a: None, unique_for=30, unique_key=key)
    with pytest.raises(UniqueKeyError, match=error):
        job.perform_async(5)
    with pytest.raises(UniqueKeyError, match=error):
        job.perform_bulk([[5]])
    assert nothing_written(r)


def test_unique_until_travels_in_the_payload_unless_it_is_the_default(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda a: None, unique_for=5, unique_until="start")
    job.perform_async(1)
    job.set(unique_until="expiry").perform_async(2)
    job.set(unique_until="success").perform_async(3)
    assert [p.get("unique_until") for p in queued(r)] == ["start", "expiry", None]


# -- bulk and scheduled --------------------------------------------------------
def test_bulk_locks_each_job_and_collapses_duplicates_within_the_call(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda a: None, unique_for=30)
    held = job.perform_async(3)
    jids = job.perform_bulk([[1], [2], [1], [3], [{"k": 1, "j": 2}], [{"j": 2, "k": 1}]])
    assert len(jids) == 3
    assert [p["args"] for p in queued(r)] == [[3], [1], [2], [{"k": 1, "j": 2}]]
    assert [p["jid"] for p in queued(r)] == [held, *jids]
    assert {r.get(k) for k in locks(r)} == {held, *jids}


def test_a_scheduled_jobs_lock_counts_from_its_run_time(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda a: None, unique_for=20)
    jid = job.perform_in(100, "later")
    assert jid is not None
    assert job.perform_async("later") is None
    assert job.perform_at(9e9, "later") is None
    key = lock_key(job.name, "default", ["later"])
    assert 119_000 < r.pttl(key) <= 120_000
    assert r.zcard("schedule") == 1 and r.llen("queue:default") == 0
    # Scheduled in a bulk push: each job's own run time.
    bulk = Client(config).push_bulk({"class": job.name, "args": [["a"], ["b"]],
                                     "unique_for": 20, "at": [9e9 + 1, 0.0]})
    assert len(bulk) == 2
    assert r.pttl(lock_key(job.name, "default", ["b"])) <= 20_000


def test_the_classic_poller_promotes_a_scheduled_unique_job_it_holds_the_lock_of(
        config: Config, r: redis.Redis, define: Define) -> None:
    from wurk.runtime.scheduled import Poller
    config = tuned(config, reliable_scheduler=False)
    job = define(lambda a: None, unique_for=20)
    jid = job.perform_in(5, "x")
    import time
    assert Poller(config).enqueue_due(time.time() + 10) == 1
    assert [p["jid"] for p in queued(r)] == [jid]  # its own lock: not a duplicate


# -- garbage in Redis ----------------------------------------------------------
@pytest.mark.parametrize("plant", [
    lambda r, key: r.set(key, "\xff not a jid"),
    lambda r, key: r.hset(key, "some", "hash"),
    lambda r, key: r.rpush(key, "a list"),
])
def test_a_garbage_lock_blocks_only_until_it_expires(
        plant: Callable[[redis.Redis, str], Any], config: Config, r: redis.Redis,
        define: Define) -> None:
    job = define(lambda a: None, unique_for=2)
    key = lock_key(job.name, "default", [1])
    plant(r, key)
    assert job.perform_async(1) is None
    assert 0 < r.pttl(key) <= 2000  # a lock without a TTL gets the pusher's
    r.delete(key)
    assert job.perform_async(1) is not None


def test_a_raw_push_with_a_huge_unique_for_or_a_far_off_time_still_locks(
        config: Config, r: redis.Redis) -> None:
    client = Client(config)
    assert client.push({"class": "Huge", "args": [1], "unique_for": 1e300}) is not None
    assert client.push({"class": "Huge", "args": [1], "unique_for": 1e300}) is None
    # The farthest time a push takes (about the year 5138): the lock's TTL still fits Redis.
    assert client.push({"class": "Huge", "args": [2], "unique_for": 5, "at": 9.9e10}) is not None
    assert 0 < r.pttl(lock_key("Huge", "default", [2])) <= 10**15
    assert 0 < r.pttl(lock_key("Huge", "default", [1])) <= 10**15


def test_lock_of_reads_untrusted_payloads() -> None:
    key = lock_key("C", "q", [1])
    assert unique.lock_of({"class": "C", "queue": "q", "args": [1]}) == key
    assert unique.lock_of({"unique_lock": key, "class": "other"}) == key
    assert unique.lock_of({"unique_lock": "queues", "class": "C", "queue": "q",
                           "args": [1]}) == key  # a recorded key must look like one
    assert unique.lock_of({"class": 5, "queue": "q"}) is None
    assert unique.lock_of({"class": "C", "queue": "q", "args": [math.nan]}) is None
    assert unique.until_of({"unique_until": ["start"]}) == "success"
    assert [unique.is_unique({"unique_for": v}) for v in (1, 0.5, 0, -1, True, "1", math.inf)] \
        == [True, True, False, False, False, False, False]


# -- a push that took its lock but was not written -----------------------------
def test_a_push_whose_write_fails_gives_its_lock_back(
        config: Config, r: redis.Redis, define: Define, monkeypatch: pytest.MonkeyPatch) -> None:
    job = define(lambda a: None, unique_for=30)
    client = Client(config, buffered=False)

    def refused(*args: Any, **kwargs: Any) -> Iterator[Any]:
        raise ConnectError("cannot connect: nothing was sent")
        yield  # the writer's write is a flow

    monkeypatch.setattr(client.writer, "write", refused)
    enqueuer = job.set(client=client)
    with pytest.raises(redis.ConnectionError):
        enqueuer.perform_async(1)
    with pytest.raises(redis.ConnectionError):
        enqueuer.perform_bulk([[1], [2]])
    assert locks(r) == []
    monkeypatch.undo()
    assert enqueuer.perform_async(1) is not None  # not refused as its own duplicate


def test_a_push_whose_write_may_have_landed_keeps_its_lock(
        config: Config, r: redis.Redis, define: Define, monkeypatch: pytest.MonkeyPatch) -> None:
    job = define(lambda a: None, unique_for=30)
    client = Client(config, buffered=False)

    def lost(*args: Any, **kwargs: Any) -> Iterator[Any]:
        raise redis.ConnectionError("the connection broke after sending")
        yield  # the writer's write is a flow

    monkeypatch.setattr(client.writer, "write", lost)
    enqueuer = job.set(client=client)
    with pytest.raises(redis.ConnectionError):
        enqueuer.perform_async(1)
    # The job may be queued: a retry must be refused as its duplicate, not written twice.
    assert len(locks(r)) == 1
    monkeypatch.undo()
    assert enqueuer.perform_async(1) is None


def test_a_bulk_batch_a_middleware_fails_takes_no_lock(
        config: Config, r: redis.Redis, define: Define) -> None:
    def picky(job_class: str, payload: dict[str, Any], queue: str, pool: Any,
              call_next: Callable[[], Any]) -> None:
        if payload["args"] == [3]:
            raise ValueError("not three")
        call_next()

    config.client_middleware.append(picky)
    job = define(lambda a: None, unique_for=30)
    with pytest.raises(ValueError, match="not three"):
        job.perform_bulk([[1], [2], [3]])
    assert locks(r) == [] and nothing_written(r)
    assert len(job.perform_bulk([[1], [2]])) == 2


# -- Redis trouble -------------------------------------------------------------
def test_a_lost_reply_to_the_lock_is_replayed_and_granted_to_the_same_push(
        proxy: Any, r: redis.Redis) -> None:
    config = Config(redis_url=f"redis://127.0.0.1:{proxy.port}/0", log_level="warning")
    client = Client(config, buffered=False, drain_spool=False)
    assert client.push({"class": "Warm", "args": []})  # the connection, warmed up
    proxy.drop_next_reply()  # the lock script ran; its reply is lost
    jid = client.push({"class": "Lossy", "args": [1], "unique_for": 30})
    assert jid is not None and r.get(lock_key("Lossy", "default", [1])) == jid
    assert [p["jid"] for p in queued(r) if p["class"] == "Lossy"] == [jid]
    assert client.push({"class": "Lossy", "args": [1], "unique_for": 30}) is None


def test_with_redis_unreachable_a_unique_push_raises_and_writes_nothing(
        proxy: Any, r: redis.Redis) -> None:
    config = Config(redis_url=f"redis://127.0.0.1:{proxy.port}/0", log_level="warning",
                    redis_retry_attempts=1)
    client = Client(config, drain_spool=False)  # buffered: a plain push would wait
    proxy.refuse()
    with pytest.raises(redis.ConnectionError):
        client.push({"class": "Down", "args": [1], "unique_for": 30})
    proxy.heal()
    assert nothing_written(r)
    assert client.push({"class": "Down", "args": [1], "unique_for": 30}) is not None


def test_a_bulk_batch_takes_all_its_locks_in_one_round_trip(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda a: None, unique_for=30)
    assert job.perform_async("warm") is not None  # the script is loaded
    r.config_resetstat()
    assert len(job.perform_bulk([[i] for i in range(300)] + [[0]])) == 300
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    # Inside the script one per job, and the write's connection mark.
    assert stats["cmdstat_set"]["calls"] == 302

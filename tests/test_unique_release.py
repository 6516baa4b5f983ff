"""Unique jobs, worker side (wurk.unique.step): when each ``unique_until``
mode gives the lock back, with in-process workers on a real redis-server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.unique.keys import lock_key

Define = Callable[..., Any]
Launch = Callable[..., Launcher]


class Held:
    """A job body that records its runs and waits until the test lets it go."""

    def __init__(self, fail_times: int = 0) -> None:
        self.__name__ = "held"
        self.__qualname__ = "held"
        self.started = threading.Semaphore(0)
        self.go = threading.Event()
        self.runs = 0
        self.fail_times = fail_times

    def __call__(self, *args: Any) -> None:
        self.runs += 1
        self.started.release()
        assert self.go.wait(20)
        if self.runs <= self.fail_times:
            raise RuntimeError(f"run {self.runs} fails")

    def wait_started(self) -> None:
        assert self.started.acquire(timeout=10)


def processed(r: redis.Redis) -> int:
    return int(r.get("stat:processed") or 0)


def key_of(job: Any, *args: Any) -> str:
    return lock_key(job.name, "default", list(args))


def test_success_releases_after_the_job_succeeded(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held()
    job = define(body, unique_for=30)
    jid = job.perform_async(1)
    launch()
    body.wait_started()
    assert r.get(key_of(job, 1)) == jid
    assert job.perform_async(1) is None  # running: still a duplicate
    body.go.set()
    wait_for(lambda: not r.exists(key_of(job, 1)))
    assert job.perform_async(1) is not None


def test_start_releases_as_the_job_starts(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held()
    job = define(body, unique_for=30, unique_until="start")
    assert job.perform_async(1) is not None
    # the duplicate waits in its queue, its lock held, while the first runs
    config = tuned(config, concurrency=1)
    launch()
    body.wait_started()
    assert not r.exists(key_of(job, 1))
    again = job.perform_async(1)  # a duplicate may wait while the first runs
    assert again is not None and r.get(key_of(job, 1)) == again
    body.go.set()
    body.wait_started()
    wait_for(lambda: not r.exists(key_of(job, 1)))


def test_expiry_keeps_the_lock_after_success_until_it_expires(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held()
    body.go.set()
    job = define(body, unique_for=30, unique_until="expiry")
    jid = job.perform_async(1)
    launch()
    body.wait_started()
    wait_for(lambda: processed(r) == body.runs)
    assert r.get(key_of(job, 1)) == jid and r.pttl(key_of(job, 1)) > 20_000
    assert job.perform_async(1) is None
    r.pexpire(key_of(job, 1), 100)  # the rest of unique_for passes
    wait_for(lambda: not r.exists(key_of(job, 1)))
    assert job.perform_async(1) is not None


def test_a_failure_that_retries_keeps_the_lock_and_its_success_releases_it(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held(fail_times=2)
    body.go.set()
    job = define(body, unique_for=30)
    jid = job.perform_async(1)
    launch()
    for run in (1, 2, 3):
        body.wait_started()
        if run == 3:
            break
        wait_for(lambda: r.zcard("retry") == 1)
        assert r.get(key_of(job, 1)) == jid
        assert job.perform_async(1) is None
        [member] = r.zrange("retry", 0, -1)
        r.zadd("retry", {member: 0})  # due now, rather than after Sidekiq's backoff
    wait_for(lambda: not r.exists(key_of(job, 1)))
    assert body.runs == 3 and r.zcard("retry") == 0
    assert job.perform_async(1) is not None


@pytest.mark.parametrize(("options", "where"), [
    ({"retry": 0}, "dead"),        # retries exhausted: dead
    ({"retry": False}, None),      # no retries: dropped
    ({"retry": 0, "dead": False}, None),
])
def test_a_job_that_dies_releases_its_lock(
        options: dict[str, Any], where: str | None, config: Config, r: redis.Redis,
        define: Define, launch: Launch) -> None:
    body = Held(fail_times=1)
    body.go.set()
    job = define(body, unique_for=30, **options)
    assert job.perform_async(1) is not None
    launch()
    body.wait_started()
    wait_for(lambda: not r.exists(key_of(job, 1)))
    if where:
        # The release is written with the settlement, just before the dead entry.
        wait_for(lambda: r.zcard(where) == 1, what=f"the job in {where}")


def test_expiry_keeps_the_lock_even_when_the_job_dies(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held(fail_times=1)
    body.go.set()
    job = define(body, unique_for=30, unique_until="expiry", retry=0)
    jid = job.perform_async(1)
    launch()
    body.wait_started()
    wait_for(lambda: r.zcard("dead") == 1)
    assert r.get(key_of(job, 1)) == jid


def test_release_drops_only_a_lock_that_still_holds_the_jobs_jid(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    body = Held()
    job = define(body, unique_for=30)
    job.perform_async(1)
    job.perform_async(2)
    launch()
    body.wait_started()
    body.wait_started()
    # Ours expired and a duplicate took the key; the other one is garbage.
    r.set(key_of(job, 1), "a-duplicates-jid", px=30_000)
    r.delete(key_of(job, 2))
    r.hset(key_of(job, 2), "not", "a lock")
    body.go.set()
    wait_for(lambda: processed(r) == body.runs)
    assert r.get(key_of(job, 1)) == "a-duplicates-jid"
    assert r.hgetall(key_of(job, 2)) == {"not": "a lock"}


def test_a_job_sidekiq_pushed_releases_the_digest_of_its_payload(
        config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    import json
    body = Held()
    body.go.set()
    job = define(body)
    key = key_of(job, {"a": 1})
    r.set(key, "rubyjid000000000000000000", ex=30)
    r.lpush("queue:default", json.dumps({
        "class": job.name, "args": [{"a": 1}], "jid": "rubyjid000000000000000000",
        "queue": "default", "retry": True, "unique_for": 30, "created_at": time.time(),
        "enqueued_at": time.time()}))
    launch()
    body.wait_started()
    wait_for(lambda: not r.exists(key))


def test_a_dead_unique_job_retried_from_the_api_takes_its_lock_again(
        config: Config, r: redis.Redis) -> None:
    import json

    from wurk.api import DeadSet

    def dead(jid: str, arg: int) -> None:
        r.zadd("dead", {json.dumps({"class": "Feed", "args": [arg], "jid": jid,
                                    "queue": "default", "retry": True, "retry_count": 3,
                                    "unique_for": 30, "failed_at": time.time()}): time.time()})

    dead("a" * 24, 1)
    dead("b" * 24, 2)
    r.set(lock_key("Feed", "default", [2]), "another-jid", ex=30)  # a duplicate since
    dead_set = DeadSet(config=config)
    for jid in ("a" * 24, "b" * 24):
        entry = dead_set.find_job(jid)
        assert entry is not None and entry.retry()
    assert r.get(lock_key("Feed", "default", [1])) == "a" * 24
    assert [json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)] == ["a" * 24]
    assert r.zcard("dead") == 0  # the refused one is gone, as with Sidekiq's API


def test_a_release_redis_refused_lands_once_it_answers_again(
        redis_server: Any, r: redis.Redis, proxy: Any, define: Define,
        launch_with: Launch) -> None:
    # A host cut off while its unique job finishes: the lock must still go
    # once the network heals, not hold the finished job's jid for an hour.
    config = Config(redis_url=proxy.url, heartbeat_interval=0.2, poll_interval_average=0.1,
                    fetch_timeout=0.2, shutdown_timeout=2.0, concurrency=1,
                    redis_retry_base=0.05, redis_retry_cap=0.2, log_level="warning")
    body = Held()
    job = define(body, unique_for=3600)
    assert job.set(client=wurk.Client(Config(redis_url=redis_server.url))).perform_async(
        "a") is not None
    key = key_of(job, "a")
    launch_with(config)
    body.wait_started()
    proxy.refuse(10**9)  # every new dial is reset (the listener stays: no port to lose)
    proxy.half_close()  # and every open socket of the worker's sees the cut
    with capture_logs() as logs:
        body.go.set()
        wait_for(lambda: any(e["event"] == "unique.release_failed" for e in logs), timeout=20,
                 what="the release refused while cut off")
    assert r.exists(key)
    proxy.heal()
    wait_for(lambda: not r.exists(key), timeout=30, what="the lock released after the heal")
    assert body.runs == 1


def test_a_job_deleted_or_killed_by_a_person_gives_its_lock_back(config: Config,
                                                                r: redis.Redis) -> None:
    from wurk.api import DeadSet, Queue, RetrySet, ScheduledSet

    @wurk.job(name="OnceOnly", unique_for=3600)
    def once_only(n: int) -> None:
        pass

    queued = once_only.perform_async(1)
    later = once_only.perform_in(600, 2)
    assert queued and later
    key_queued, key_later = key_of(once_only, 1), key_of(once_only, 2)
    assert r.get(key_queued) == queued and r.exists(key_later)
    record = Queue("default", config=config).find_job(queued)
    assert record is not None and record.delete()
    assert not r.exists(key_queued)
    assert once_only.perform_async(1) is not None  # a duplicate may go now
    entry = ScheduledSet(config=config).find_job(later)
    assert entry is not None and entry.kill()
    assert not r.exists(key_later) and DeadSet(config=config).size == 1
    # A lock that another push took since is not ours to drop.
    r.set(key_later, "someone-else", ex=60)
    [dead] = list(DeadSet(config=config))
    assert dead.delete() and r.get(key_later) == "someone-else"
    assert RetrySet(config=config).size == 0

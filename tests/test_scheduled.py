"""The scheduler poller: interval spread, moving due jobs, and a job run on time (spec §5)."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from tuning import tuned
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.push.job import registry
from wurk.redis.runtime import close_runtime
from wurk.runtime import scheduled
from wurk.runtime.launcher import Launcher
from wurk.runtime.scheduled import Poller, random_poll_interval
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire.payload import new_jid


class FixedRng(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


# -- random_poll_interval ------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 5, 9])
def test_poll_interval_below_ten_processes(count: int) -> None:
    rng = random.Random(count)
    samples = [random_poll_interval(4.0, count, rng) for _ in range(2000)]
    assert all(2.0 <= s <= 6.0 for s in samples)
    assert min(samples) < 2.1
    assert max(samples) > 5.9
    assert random_poll_interval(4.0, count, FixedRng(0.0)) == 2.0
    assert random_poll_interval(4.0, count, FixedRng(0.5)) == 4.0


@pytest.mark.parametrize("count", [10, 11, 50])
def test_poll_interval_ten_or_more_processes(count: int) -> None:
    rng = random.Random(count)
    samples = [random_poll_interval(4.0, count, rng) for _ in range(2000)]
    assert all(0.0 <= s < 4.0 for s in samples)
    assert min(samples) < 0.1
    assert max(samples) > 3.9
    assert random_poll_interval(4.0, count, FixedRng(0.0)) == 0.0


# -- enqueue_due -----------------------------------------------------------------------------


def stored(**extra: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"retry": True, "queue": "default", "class": "SchedJob",
                           "args": [1, {"k": "v"}], "jid": new_jid(),
                           "created_at": 1700000000.125}
    job.update(extra)
    return job


def zadd_job(r: redis.Redis, key: str, job: dict[str, Any], at: float) -> str:
    raw = json.dumps(job)
    r.zadd(key, {raw: at})
    return raw


def queue_jobs(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    """Oldest first (the right end of the list is the next to run)."""
    return [json.loads(x) for x in reversed(r.lrange(f"queue:{name}", 0, -1))]


@pytest.fixture(params=["reliable", "classic"])
def scheduler_mode(request: pytest.FixtureRequest) -> str:
    """Every poller test runs against both the reliable and the classic scheduler."""
    return str(request.param)


@pytest.fixture
def config(config: Config, scheduler_mode: str) -> Config:
    """The shared test config, set to this run's scheduler (and installed)."""
    return tuned(config, reliable_scheduler=scheduler_mode == "reliable")


def test_enqueue_due_moves_due_jobs_and_keeps_their_fields(r: redis.Redis, config: Config,
                                                           scheduler_mode: str) -> None:
    now = time.time()
    retry_job = stored(queue="mail", retry_count=2, error_message="boom", error_class="E",
                       failed_at=now - 100, bid="batch-1", tags=["a"], enqueued_at=now - 200)
    sched_job = stored(queue="mail", unique_for=30, custom={"nested": [1, 2]})
    zadd_job(r, "retry", retry_job, now - 5)
    zadd_job(r, "schedule", sched_job, now - 1)
    poller = Poller(config)
    before = time.time()
    assert poller.enqueue_due() == 2
    after = time.time()
    assert r.zcard("retry") == 0
    assert r.zcard("schedule") == 0
    assert "mail" in r.smembers("queues")
    moved = queue_jobs(r, "mail")
    # retry is swept before schedule, so it sits at the older end.
    assert [j["jid"] for j in moved] == [retry_job["jid"], sched_job["jid"]]
    for original, job in zip((retry_job, sched_job), moved, strict=True):
        assert before <= job["enqueued_at"] <= after
        assert isinstance(job["enqueued_at"], float)
        rest = {k: v for k, v in job.items() if k != "enqueued_at"}
        expected = {k: v for k, v in original.items() if k != "enqueued_at"}
        if scheduler_mode == "classic" and "unique_for" in original:
            # The classic poller pushes through the client, whose unique-jobs
            # middleware takes the lock and records its key (wurk.unique.push).
            assert rest.pop("unique_lock") == lock_key(original["class"], "mail",
                                                       original["args"])
        assert rest == expected


def test_enqueue_due_leaves_future_jobs(r: redis.Redis, config: Config) -> None:
    now = time.time()
    due = stored()
    later_raw = zadd_job(r, "schedule", stored(), now + 60)
    later_retry = zadd_job(r, "retry", stored(), now + 60)
    zadd_job(r, "schedule", due, now - 0.5)
    assert Poller(config).enqueue_due() == 1
    assert r.zrange("schedule", 0, -1) == [later_raw]
    assert r.zrange("retry", 0, -1) == [later_retry]
    assert [j["jid"] for j in queue_jobs(r, "default")] == [due["jid"]]


def test_enqueue_due_with_an_explicit_now(r: redis.Redis, config: Config) -> None:
    now = time.time()
    zadd_job(r, "schedule", stored(), now + 3600)
    poller = Poller(config)
    assert poller.enqueue_due(now=now) == 0
    assert poller.enqueue_due(now=now + 7200) == 1
    assert r.llen("queue:default") == 1


def test_malformed_member_goes_to_dead_and_the_sweep_goes_on(r: redis.Redis,
                                                             config: Config) -> None:
    now = time.time()
    r.zadd("schedule", {"this is {not json": now - 10})
    r.zadd("retry", {"[1, 2, 3]": now - 10})
    good = stored()
    zadd_job(r, "schedule", good, now - 5)
    assert Poller(config).enqueue_due() == 1
    assert set(r.zrange("dead", 0, -1)) == {"this is {not json", "[1, 2, 3]"}
    assert r.zcard("schedule") == 0
    assert r.zcard("retry") == 0
    assert [j["jid"] for j in queue_jobs(r, "default")] == [good["jid"]]


@pytest.mark.parametrize("bad", [
    {"class": "SchedJob", "args": [], "queue": 5},
    {"class": "SchedJob", "args": [], "queue": ""},
    # An "at" is not read at all (the score said the job is due): test_hostile_times.py.
    {"class": "", "args": []},
])
def test_unpushable_member_goes_to_dead_not_lost(r: redis.Redis, config: Config,
                                                 bad: dict[str, Any]) -> None:
    now = time.time()
    raw = zadd_job(r, "retry", bad, now - 10)
    good = stored()
    zadd_job(r, "retry", good, now - 5)
    assert Poller(config).enqueue_due() == 1
    assert r.zrange("dead", 0, -1) == [raw]
    assert r.zcard("retry") == 0
    assert [j["jid"] for j in queue_jobs(r, "default")] == [good["jid"]]


def test_poller_thread_moves_due_jobs_and_stop_joins_it(r: redis.Redis,
                                                        config: Config) -> None:
    poller = Poller(config)
    poller.start()
    thread = poller.service.thread
    assert thread is not None and thread.is_alive()
    try:
        zadd_job(r, "schedule", stored(), time.time() - 1)
        wait_for(lambda: r.llen("queue:default") == 1)
    finally:
        poller.stop()
    assert not thread.is_alive()
    assert not poller.service.alive()
    # stop is terminal: a later sweep moves nothing.
    zadd_job(r, "schedule", stored(), time.time() - 1)
    assert poller.enqueue_due() == 0
    assert r.zcard("schedule") == 1


def test_stop_without_start_is_harmless(config: Config) -> None:
    poller = Poller(config)
    poller.stop()
    assert poller.service.thread is None


# -- end to end ---------------------------------------------------------------------------------


@pytest.fixture
def launcher(config: Config) -> Iterator[Launcher]:
    instance = Launcher(config)
    yield instance
    if not instance.stopped.is_set():
        instance.stop(time.monotonic() + 1)


def test_perform_in_runs_when_due(r: redis.Redis, config: Config, launcher: Launcher) -> None:
    name = f"sched_e2e_{uuid.uuid4().hex}"
    ran: list[tuple[float, list[Any]]] = []
    done = threading.Event()

    @wurk.job(name=name)
    def scheduled_job(*args: Any) -> None:
        ran.append((time.time(), list(args)))
        done.set()

    try:
        pushed_at = time.time()
        jid = scheduled_job.perform_in(0.5, "hello", 2)
        entry = json.loads(r.zrange("schedule", 0, -1)[0])
        assert entry["jid"] == jid
        assert "enqueued_at" not in entry
        assert "at" not in entry
        launcher.start()
        assert done.wait(EVENTUALLY), "scheduled job did not run"
        ran_at, args = ran[0]
        assert args == ["hello", 2]
        assert ran_at >= pushed_at + 0.45
        assert r.zcard("schedule") == 0
    finally:
        registry.discard(name)


# -- the reliable scheduler's guarantees -------------------------------------------------

def test_reliable_scheduler_loses_nothing_when_the_move_never_happens(
        r: redis.Redis, config: Config, scheduler_mode: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if scheduler_mode != "reliable":
        pytest.skip("the classic poller has a known pop-then-push window")
    job = stored(queue="mail")
    zadd_job(r, "schedule", job, time.time() - 1)
    poller = Poller(config)

    def crash(*_: Any) -> int:
        raise RuntimeError("process died between reading and moving")

    monkeypatch.setattr(poller, "_promote", crash)
    with pytest.raises(RuntimeError):
        poller.enqueue_due()
    assert r.zcard("schedule") == 1
    assert r.llen("queue:mail") == 0
    monkeypatch.undo()
    assert Poller(config).enqueue_due() == 1
    assert [j["jid"] for j in queue_jobs(r, "mail")] == [job["jid"]]


def test_racing_reliable_pollers_push_each_job_once(r: redis.Redis, config: Config,
                                                   scheduler_mode: str) -> None:
    if scheduler_mode != "reliable":
        pytest.skip("racing classic pollers are safe too, but this checks the script")
    jobs = [stored(queue="mail") for _ in range(300)]
    for job in jobs:
        zadd_job(r, "schedule", job, time.time() - 1)
    pollers = [Poller(config) for _ in range(4)]
    counts: list[int] = []
    threads = [threading.Thread(target=lambda p=p: counts.append(p.enqueue_due()))
               for p in pollers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sum(counts) == 300
    jids = [j["jid"] for j in queue_jobs(r, "mail")]
    assert sorted(jids) == sorted(j["jid"] for j in jobs)
    assert r.zcard("schedule") == 0


# -- nothing stops the scheduler -----------------------------------------------------------

def deeply_nested(depth: int = 100_000) -> str:
    """A member that decodes to a RecursionError, not a PayloadError."""
    return '{"class":"X","args":' + "[" * depth + "]" * depth + "}"


def test_a_deeply_nested_member_goes_to_dead_and_the_rest_move(r: redis.Redis,
                                                               config: Config) -> None:
    now = time.time()
    bad = deeply_nested()
    r.zadd("retry", {bad: now - 60})  # the oldest: first in line
    good = [stored() for _ in range(3)]
    for job in good:
        zadd_job(r, "retry", job, now - 5)
    later = stored()
    zadd_job(r, "schedule", later, now - 1)
    assert Poller(config).enqueue_due() == 4
    assert r.zrange("dead", 0, -1) == [bad]
    assert r.zcard("retry") == 0 and r.zcard("schedule") == 0
    assert sorted(j["jid"] for j in queue_jobs(r, "default")) == sorted(
        j["jid"] for j in [*good, later])


def test_a_member_whose_handling_raises_anything_goes_to_dead(
        r: redis.Redis, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    bad, good = stored(queue="poison"), stored()
    bad_raw = zadd_job(r, "schedule", bad, now - 10)
    zadd_job(r, "schedule", good, now - 5)
    poller = Poller(config)
    normalise = poller.client.normalise

    def exits_on_poison(item: Any, at: float) -> Any:
        if item.get("queue") == "poison":
            raise SystemExit("out of a library")
        return normalise(item, at)

    monkeypatch.setattr(poller.client, "normalise", exits_on_poison)
    assert poller.enqueue_due() == 1
    assert r.zrange("dead", 0, -1) == [bad_raw]
    assert [j["jid"] for j in queue_jobs(r, "default")] == [good["jid"]]


def test_the_scheduler_survives_an_outage_in_its_interval_read(
        redis_server: RedisServer, r: redis.Redis, config: Config,
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = FaultProxy(redis_server.port)
    own = dataclasses.replace(config, redis_url=proxy.url, poll_interval_average=None,
                              average_scheduled_poll_interval=0.1, redis_retry_attempts=1,
                              redis_connect_timeout=0.3)
    monkeypatch.setattr(scheduled, "INITIAL_WAIT", 0.0)
    poller = Poller(own, rng=FixedRng(0.0))
    proxy.refuse()  # Redis away before the first cycle: the sweep and SCARD both fail
    try:
        with capture_logs() as logs:
            poller.start()
            wait_for(lambda: sum(e["event"] == "scheduler.interval_failed" for e in logs) >= 2,
                     what="two cycles through the outage")
        assert poller.service.alive()
        proxy.heal()
        job = stored()
        zadd_job(r, "schedule", job, time.time() - 1)
        wait_for(lambda: r.llen("queue:default") == 1, what="the due job moved after the outage")
        assert [j["jid"] for j in queue_jobs(r, "default")] == [job["jid"]]
    finally:
        poller.stop()
        close_runtime(own)
        proxy.close()


def test_the_scheduler_thread_outlives_a_base_exception_in_a_cycle(
        r: redis.Redis, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    poller = Poller(config)
    enqueue_due = poller.enqueue_due
    calls: list[int] = []

    def exits_once(now: float | None = None) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit("out of a library")
        return enqueue_due(now)

    monkeypatch.setattr(poller, "enqueue_due", exits_once)
    poller.start()
    try:
        wait_for(lambda: len(calls) >= 2, what="a cycle after the SystemExit")
        zadd_job(r, "schedule", stored(), time.time() - 1)
        wait_for(lambda: r.llen("queue:default") == 1, what="the due job moved")
    finally:
        poller.stop()

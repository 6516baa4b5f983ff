"""Jobs removed by a person (wurk.api.removal): a clear of a queue or of the
retry, schedule or dead set releases the unique locks its jobs hold, in
chunks; a deleted or killed job ends in its batch and for its result waiters.
Real redis-server; the admin CLI and the dashboard through their own entry
points."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli
from starlette.testclient import TestClient
from waiting import wait_for

import wurk
import wurk.web
from wurk.api import DeadSet, Queue, RetrySet, ScheduledSet
from wurk.api import removal as removal_module
from wurk.batches import step as runtime_batch
from wurk.push.client import Client
from wurk.redis.runtime import runtime_for
from wurk.results.client import Outcome, wait
from wurk.runtime.retry import kill as kill_raw
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire import keys

cli = admin_cli.cli
keep_logging = admin_cli.keep_logging


def push(config: Config, n: int, **extra: Any) -> str:
    jid = Client(config).push({"class": "Feed", "args": [n], "unique_for": 3600, **extra})
    assert jid is not None
    return jid


def lock(n: int) -> str:
    return lock_key("Feed", "default", [n])


def can_push_again(config: Config, *numbers: int) -> bool:
    return all(Client(config).push({"class": "Feed", "args": [n], "unique_for": 3600})
               for n in numbers)


def into(r: redis.Redis, name: str, config: Config, *numbers: int) -> list[str]:
    """Unique jobs holding their locks, sitting in the sorted set ``name``."""
    jids = [push(config, n, at=time.time() + 600) for n in numbers]
    if name != keys.SCHEDULE:
        members = r.zrange(keys.SCHEDULE, 0, -1)
        r.delete(keys.SCHEDULE)
        r.zadd(name, {member: time.time() + 600 for member in members})
    return jids


def locks_held(r: redis.Redis) -> list[str]:
    return sorted(r.scan_iter("unique:*"))


# -- clears release locks ----------------------------------------------------------
def test_clearing_a_queue_releases_its_jobs_locks_and_only_theirs(
        config: Config, r: redis.Redis) -> None:
    jids = [push(config, n) for n in range(3)]
    for n, holder in ((3, "ruby-jid"), (4, "another-jid")):
        # As Sidekiq Enterprise pushes: no unique_lock field, the key is the digest.
        r.set(lock(n), holder, ex=60)
        r.lpush("queue:default", json.dumps({"class": "Feed", "queue": "default", "args": [n],
                                             "jid": "ruby-jid", "unique_for": 60}))
    assert r.get(lock(0)) == jids[0]
    assert Queue("default", config=config).clear() == 5
    assert r.llen("queue:default") == 0 and not r.sismember("queues", "default")
    # Lock 4 is held by a job this queue did not hold: not ours to drop.
    assert locks_held(r) == [lock(4)] and r.get(lock(4)) == "another-jid"
    assert can_push_again(config, 0, 1, 2, 3)
    assert not r.exists(keys.CLEARING)


@pytest.mark.parametrize("name", [keys.RETRY, keys.SCHEDULE, keys.DEAD])
def test_clearing_a_sorted_set_releases_its_jobs_locks(
        config: Config, r: redis.Redis, name: str) -> None:
    into(r, name, config, 0, 1)
    assert len(locks_held(r)) == 2
    cleared = {keys.RETRY: RetrySet, keys.SCHEDULE: ScheduledSet, keys.DEAD: DeadSet}[name]
    assert cleared(config=config).clear() == 2
    assert r.zcard(name) == 0 and locks_held(r) == []
    assert can_push_again(config, 0, 1)


def test_clearing_the_dead_set_drops_the_notes_of_its_entries(
        config: Config, r: redis.Redis) -> None:
    DeadSet(config=config).kill(b"\xff not json", notify_failure=False)
    kill_raw(runtime_for(config), "also not json", reason=("wurk.Malformed", "not JSON"))
    assert r.hlen(keys.DEAD_NOTES) == 1
    assert DeadSet(config=config).clear() == 2
    assert r.hlen(keys.DEAD_NOTES) == 0 and r.zcard(keys.DEAD_NOTES_AT) == 0


def test_a_20k_job_queue_clears_in_chunks_and_releases_every_lock(
        config: Config, r: redis.Redis) -> None:
    total = 20_000
    pipe = r.pipeline(transaction=False)
    for n in range(total):
        jid = f"jid-{n:06d}"
        pipe.lpush("queue:default", json.dumps(
            {"class": "Feed", "queue": "default", "args": [n], "jid": jid, "unique_for": 3600,
             "unique_lock": lock(n), "enqueued_at": time.time()}))
        pipe.set(lock(n), jid, ex=3600)
        if n % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    pipe.sadd("queues", "default").execute()
    calls = _script_calls(r)
    assert Queue("default", config=config).clear() == total
    assert r.llen("queue:default") == 0 and locks_held(r) == []
    # One script per chunk (and one to take the queue), never one for the whole queue.
    assert _script_calls(r) - calls >= total // removal_module.CHUNK
    assert can_push_again(config, 0, total - 1)


def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in
               ("cmdstat_evalsha", "cmdstat_eval"))


def test_a_clear_cut_short_is_finished_by_the_next_clear(
        config: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(removal_module.CHUNK + 10):
        push(config, n)
    real = removal_module._chunk
    calls = 0

    def dies_after_one(*args: Any, **kwargs: Any) -> list[bool]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise ConnectionError("the operator's laptop lost its network")
        return real(*args, **kwargs)

    monkeypatch.setattr(removal_module, "_chunk", dies_after_one)
    with pytest.raises(ConnectionError):
        Queue("default", config=config).clear()
    assert len(locks_held(r)) == 10 and r.hlen(keys.CLEARING) == 1
    assert r.llen("queue:default") == 0  # cleared as asked: no job comes back
    monkeypatch.setattr(removal_module, "_chunk", real)
    assert Queue("other", config=config).clear() == 0
    assert locks_held(r) == [] and not r.exists(keys.CLEARING)


def test_wurk_retries_clear_and_the_dashboards_buttons_release_locks(
        cli: Cli, config: Config, r: redis.Redis) -> None:
    into(r, keys.RETRY, config, 0)
    done = cli("retries", "clear", "--yes", "--json")
    assert done.code == 0 and done.json["count"] == 1 and locks_held(r) == []
    push(config, 1)
    into(r, keys.SCHEDULE, config, 2, 3)
    with TestClient(wurk.web.app(config)) as web:
        csrf = _token(web)
        web.post("/queues/default/clear", data={"csrf": csrf, "confirm": "default"})
        assert locks_held(r) == sorted([lock(2), lock(3)])
        killed = web.post("/scheduled/all", data={"csrf": csrf, "action": "kill",
                                                  "confirm": "all"})
        assert killed.status_code in (200, 303) and r.zcard("dead") == 2
        assert locks_held(r) == []
        into(r, keys.RETRY, config, 4)
        web.post("/retries/all", data={"csrf": csrf, "action": "delete", "confirm": "all"})
        assert r.zcard("retry") == 0 and locks_held(r) == []
    assert can_push_again(config, 0, 1, 2, 3, 4)


def _token(web: TestClient) -> str:
    page = web.get("/queues")
    marker = 'name="csrf" value="'
    return page.text.split(marker, 1)[1].split('"', 1)[0]


# -- batches and result waiters -------------------------------------------------------
@pytest.fixture
def noop(define: Callable[..., Any]) -> Any:
    def noop(*args: Any) -> int:
        return len(args)
    return define(noop, store_result=True)


def batch_of(noop: Any, count: int, **callbacks: Any) -> tuple[str, list[str]]:
    with wurk.Batch("removals", **callbacks) as b:
        jids = [b.add(noop, n) for n in range(count)]
    return b.bid, jids


def waiting(jid: str, config: Config) -> tuple[threading.Thread, list[Outcome]]:
    got: list[Outcome] = []
    thread = threading.Thread(target=lambda: got.append(wait(jid, 30, config=config)))
    thread.start()
    return thread, got


def callbacks(r: redis.Redis) -> list[dict[str, Any]]:
    """The batch callbacks queued: their first argument is the batch's status."""
    payloads = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]
    return [p for p in payloads if p["args"] and isinstance(p["args"][0], dict)]


def test_a_deleted_batch_job_counts_as_dropped_and_its_waiter_is_told(
        config: Config, r: redis.Redis, noop: Any) -> None:
    bid, (first, second) = batch_of(noop, 2, on_complete=(noop, []), on_success=(noop, []))
    thread, got = waiting(second, config)
    record = Queue("default", config=config).find_job(first)
    assert record is not None
    _succeeded(config, record.item)
    assert not r.exists(f"b-{bid}-complete")
    assert r.lrem("queue:default", 1, record.value) == 1  # as the worker's ack would
    deleted = Queue("default", config=config).find_job(second)
    assert deleted is not None and deleted.delete()
    thread.join(30)
    [outcome] = got
    assert (outcome.status, outcome.error_class, outcome.final) == (
        "failed", "JobDeletedError", True)
    assert "deleted by a person from queue 'default'" in outcome.error_message
    assert r.exists(f"b-{bid}-complete") and r.exists(f"b-{bid}-death")
    assert not r.exists(f"b-{bid}-success")
    assert r.scard(f"b-{bid}-died") == 1 and r.hget(f"b-{bid}", "failures") == "1"
    info = json.loads(r.hget(f"b-{bid}-failinfo", second))
    assert info["class"] == "JobDeletedError"
    assert [c["args"][0]["event"] for c in callbacks(r)] == ["complete"]


def _succeeded(config: Config, item: dict[str, Any]) -> None:
    assert runtime_batch.succeeded(runtime_for(config), dict(item), lambda wait: False)


def test_a_killed_batch_job_is_a_death_its_waiter_hears_of(
        config: Config, r: redis.Redis, noop: Any) -> None:
    bid, (jid,) = batch_of(noop, 1, on_complete=(noop, []), on_death=(noop, []))
    queued = r.lpop("queue:default")
    failed = {**json.loads(queued), "retry_count": 0, "error_class": "ValueError",
              "error_message": "flaky", "failed_at": time.time()}
    runtime_batch.failed(runtime_for(config), failed, ValueError("flaky"), "retry",
                         lambda wait: False)
    assert not r.exists(f"b-{bid}-death")
    r.zadd("retry", {json.dumps(failed): time.time() + 600})
    thread, got = waiting(jid, config)
    entry = RetrySet(config=config).find_job(jid)
    assert entry is not None and entry.kill()
    thread.join(30)
    [outcome] = got
    assert (outcome.error_class, outcome.final) == ("JobKilledError", True)
    assert "killed by a person from the retry set" in outcome.error_message
    assert "its last error was ValueError: flaky" in outcome.error_message
    assert r.zcard("dead") == 1
    assert r.exists(f"b-{bid}-complete") and r.exists(f"b-{bid}-death")
    assert sorted(c["args"][0]["event"] for c in callbacks(r)) == ["complete", "death"]


def test_bulk_removal_ends_every_batch_job_and_wakes_every_waiter(
        config: Config, r: redis.Redis, noop: Any) -> None:
    bid, jids = batch_of(noop, 6, on_complete=(noop, []))
    threads = [waiting(jid, config) for jid in jids]
    members = r.lrange("queue:default", 0, 2)
    for member in members:
        r.lrem("queue:default", 1, member)
    r.zadd("schedule", {member: time.time() + 600 for member in members})
    assert ScheduledSet(config=config).kill_all() == 3
    assert Queue("default", config=config).clear() == 3
    outcomes = []
    for thread, got in threads:
        thread.join(30)
        outcomes += got
    assert sorted(o.error_class for o in outcomes) == ["JobDeletedError"] * 3 + [
        "JobKilledError"] * 3
    assert r.scard(f"b-{bid}-died") == 6 and r.exists(f"b-{bid}-complete")
    # Fired by the clear's last chunk, into the queue as it is after the take: kept.
    assert [c["args"][0]["event"] for c in callbacks(r)] == ["complete"]


def test_deleting_a_dead_batch_job_leaves_its_batch_and_result_as_they_were(
        config: Config, r: redis.Redis, noop: Any) -> None:
    bid, (jid,) = batch_of(noop, 1)
    dead = {**json.loads(r.lpop("queue:default")), "error_class": "ValueError",
            "error_message": "gone for good"}
    runtime_batch.failed(runtime_for(config), dead, ValueError("gone for good"), "dead",
                         lambda wait: False)
    r.zadd("dead", {json.dumps(dead): time.time()})
    before = r.hgetall(f"b-{bid}-failinfo")
    entry = DeadSet(config=config).find_job(jid)
    assert entry is not None and entry.delete()
    assert r.hgetall(f"b-{bid}-failinfo") == before
    assert not r.exists(f"wurk:result:{jid}")


def test_a_workflow_step_whose_job_is_deleted_fails_the_workflow(
        config: Config, r: redis.Redis, noop: Any, launch: Callable[..., Any]) -> None:
    flow = wurk.step(noop, 1, name="first") >> wurk.step(noop, 2, name="second")
    wid = wurk.Workflow(flow, policy="stop").start()
    [first] = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]
    record = Queue("default", config=config).find_job(first["jid"])
    assert record is not None and record.delete()
    launch()
    wait_for(lambda: wurk.Workflow.status(wid).finished, what="the workflow ended")
    status = wurk.Workflow.status(wid)
    assert status.state == "stopped" and status.stopped_by == "first"
    assert status.steps["first"].error is not None
    assert status.steps["first"].error["class"] == "JobDeletedError"
    assert status.steps["second"].state != "succeeded"


def test_a_clear_over_resp2_finds_its_leftovers_and_releases(
        redis_server: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    from wurk.redis.runtime import close_runtime
    resp2 = Config(redis_url=f"{redis_server.url}?protocol=2", log_level="warning")
    try:
        into(r, keys.RETRY, resp2, 0, 1)
        r.hset(keys.CLEARING, keys.clearing("left"), keys.RETRY)  # a clear cut short
        r.rename(keys.RETRY, keys.clearing("left"))
        into(r, keys.SCHEDULE, resp2, 2)
        assert ScheduledSet(config=resp2).clear() == 1
        assert locks_held(r) == [] and not r.exists(keys.CLEARING)
    finally:
        close_runtime(resp2)


def test_a_clear_takes_hostile_payloads_and_still_ends_what_they_hold(
        config: Config, r: redis.Redis, noop: Any) -> None:
    bid, (jid,) = batch_of(noop, 1)
    r.delete("queue:default")
    hostile = [
        # Lone surrogates in the class and the last error, a real batch and a result.
        f'{{"class":"X\\ud800","queue":"default","args":[],"jid":"{jid}","bid":"{bid}",'
        '"error_class":"E\\udc00","error_message":"bad \\udc00","retry_count":[1,2],'
        '"result_ttl":60}',
        '{"class":"Feed","queue":"default","args":[9],"jid":"\\ud800","unique_for":60}',
        '{"class":"Feed","queue":"default","args":[],"jid":"j3","bid":"\\ud800"}',
        "not json at all", "[1, 2]", '{"jid": 7}',
    ]
    r.lpush("queue:default", *hostile)
    assert Queue("default", config=config).clear() == len(hostile)
    assert r.llen("queue:default") == 0
    outcome = wait(jid, 5, config=config)
    assert outcome.error_class == "JobDeletedError" and "\\udc00" in outcome.error_message
    assert r.scard(f"b-{bid}-died") == 1 and r.exists(f"b-{bid}-complete")


def test_garbage_beside_the_sets_never_stops_a_chunk_halfway(
        config: Config, r: redis.Redis) -> None:
    into(r, keys.RETRY, config, 0, 1)
    r.set(keys.DEAD, "not a sorted set")
    with pytest.raises(redis.ResponseError, match="WURKREMOVE"):
        RetrySet(config=config).kill_all()
    assert r.zcard(keys.RETRY) == 2 and len(locks_held(r)) == 2  # nothing moved, nothing lost
    r.delete(keys.DEAD)
    into(r, keys.DEAD, config, 2)
    r.set(keys.DEAD_NOTES, "garbage")
    assert DeadSet(config=config).clear() == 1 and r.zcard(keys.DEAD) == 0
    assert locks_held(r) == sorted([lock(0), lock(1)])

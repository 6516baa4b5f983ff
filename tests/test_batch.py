"""Batches in one process: counters, callbacks and their status argument,
nesting, jobs added from inside, failures then success on retry, death.
Real Redis, an in-process Launcher running the jobs."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.settings.config import Config

Define = Callable[..., JobFunction[..., Any]]


def calls(r: redis.Redis, name: str) -> list[Any]:
    return [json.loads(x) for x in r.lrange(name, 0, -1)]


def recorder(define: Define, r: redis.Redis, name: str) -> JobFunction[..., Any]:
    """A callback job that appends its arguments to the list ``name``."""
    def callback(status: dict[str, Any], *args: Any) -> None:
        r.rpush(name, json.dumps([status, *args]))
    return define(callback)


def test_a_batch_fires_complete_and_success_once_with_the_status(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    work = define(lambda n: r.incr("ran"))
    done = recorder(define, r, "cb")
    with wurk.Batch("import 7", on_complete=(done, ["c", 7]), on_success=(done, ["s"]),
                    workflow={"step": 1}) as b:
        for n in range(20):
            b.add(work, n)
    assert r.hget(f"b-{b.bid}", "total") == "20"
    assert r.zscore("batches", b.bid) is not None
    launch()
    wait_for(lambda: r.llen("cb") == 2, what="both callbacks")
    got = {c[1]: c for c in calls(r, "cb")}
    assert set(got) == {"c", "s"} and got["c"][2:] == [7]
    status = got["s"][0]
    assert status["bid"] == b.bid and status["event"] == "success"
    assert status["total"] == 20 and status["pending"] == 0 and status["failures"] == 0
    assert status["description"] == "import 7" and status["workflow"] == {"step": 1}
    assert r.get("ran") == "20" and r.scard(f"b-{b.bid}-jids") == 0
    assert r.exists(f"b-{b.bid}-complete") and r.exists(f"b-{b.bid}-success")
    assert 0 < r.ttl(f"b-{b.bid}") <= 24 * 3600  # success: kept for a day


def test_an_empty_batch_completes_at_commit_and_the_plain_form_works(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    done = recorder(define, r, "cb")
    b = wurk.Batch(on_success=done)
    assert r.sismember(f"b-{b.bid}-jids", next(iter(r.smembers(f"b-{b.bid}-jids"))))
    assert not r.exists(f"b-{b.bid}-success")
    b.commit()
    b.commit()  # a second commit is nothing
    assert r.exists(f"b-{b.bid}-success")
    launch()
    wait_for(lambda: r.llen("cb") == 1)


def test_nothing_completes_while_the_builder_holds_the_batch(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    work = define(lambda: None)
    done = recorder(define, r, "cb")
    launch()
    with wurk.Batch(on_complete=done) as b:
        b.add(work)
        wait_for(lambda: r.hget(f"b-{b.bid}", "pending") == "0", what="the job ran")
        assert r.llen("cb") == 0 and not r.exists(f"b-{b.bid}-complete")
        b.add(work)
    wait_for(lambda: r.llen("cb") == 1)
    assert calls(r, "cb")[0][0]["total"] == 2


def test_jobs_added_from_inside_a_batch_job_keep_it_open(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    leaf = define(lambda n: r.rpush("leaves", n))

    def fan_out(n: int) -> None:
        current = wurk.Batch.current()
        assert current is not None
        for i in range(n):
            current.add(leaf, i)
    fan = define(fan_out)
    done = recorder(define, r, "cb")
    with wurk.Batch(on_success=done) as b:
        b.add(fan, 5)
        b.add(fan, 3)
    launch()
    wait_for(lambda: r.llen("cb") == 1)
    assert r.llen("leaves") == 8
    assert calls(r, "cb")[0][0]["total"] == 10


def test_a_child_batch_counts_in_its_parent(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    slow = define(lambda tag: r.rpush("order", tag))
    parent_done = recorder(define, r, "parent")

    def child_done(status: dict[str, Any]) -> None:
        r.rpush("order", "child-callback")
        parent = wurk.Batch.current()  # the callback runs as a job of the parent
        assert parent is not None and parent.bid == status["parent_bid"]
        parent.add(slow, "after-child")
    child_cb = define(child_done)
    with wurk.Batch("parent", on_success=parent_done) as parent:
        parent.add(slow, "p")
        with wurk.Batch("child", on_success=child_cb) as child:
            child.add(slow, "c1")
            child.add(slow, "c2")
    assert r.hget(f"b-{child.bid}", "parent_bid") == parent.bid
    assert r.smembers(f"b-{parent.bid}-kids") == {child.bid}
    launch()
    wait_for(lambda: r.llen("parent") == 1)
    order = r.lrange("order", 0, -1)
    assert order.index("child-callback") > max(order.index("c1"), order.index("c2"))
    assert order[-1] == "after-child"
    status = calls(r, "parent")[0][0]
    assert status["total"] == 3  # its job, the child's callback, the job that added


def test_a_failure_counts_for_complete_and_success_waits_for_the_retry(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    def flaky() -> None:
        if r.incr("tries") == 1:
            raise ValueError("first try fails")
    job = define(flaky, retry_in=lambda count, exc, payload: 0.5)
    done = recorder(define, r, "cb")
    with wurk.Batch(on_complete=(done, ["complete"]), on_success=(done, ["success"])) as b:
        jid = b.add(job)
    launch()
    wait_for(lambda: r.llen("cb") == 1, what="complete after the failure")
    first = calls(r, "cb")[0]
    assert first[1] == "complete" and first[0]["failures"] == 1 and first[0]["pending"] == 1
    info = json.loads(r.hget(f"b-{b.bid}-failinfo", jid))
    assert info["class"] == "ValueError" and info["message"] == "first try fails"
    wait_for(lambda: r.llen("cb") == 2, timeout=15, what="success after the retry")
    assert calls(r, "cb")[1][1] == "success"
    assert r.scard(f"b-{b.bid}-failed") == 0 and r.hget(f"b-{b.bid}", "failures") == "0"


def test_a_death_fires_death_once_and_complete_but_never_success(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    def bad() -> None:
        raise RuntimeError("always")
    job = define(bad, retry=False)
    ok = define(lambda: None)
    done = recorder(define, r, "cb")
    with wurk.Batch(on_complete=(done, ["complete"]), on_success=(done, ["success"]),
                    on_death=(done, ["death"])) as b:
        b.add(job)
        b.add(job)
        b.add(ok)
    launch()
    wait_for(lambda: r.llen("cb") == 2)
    wait_for(lambda: r.scard(f"b-{b.bid}-died") == 2)
    assert sorted(c[1] for c in calls(r, "cb")) == ["complete", "death"]
    assert r.hget(f"b-{b.bid}", "pending") == "2"


def test_a_job_counted_twice_counts_once(config: Config, r: redis.Redis, define: Define) -> None:
    """A job run again after reliable-fetch recovery: its second success changes nothing."""
    from wurk.batches import step as worker_side

    with wurk.Batch(on_success=recorder(define, r, "cb")) as b:
        jid = b.add(define(lambda: None))
        other = b.add(define(lambda: None))
    job = {"jid": jid, "bid": b.bid, "class": "x"}
    for _ in range(3):
        assert worker_side.succeeded(runtime_for(config), job, lambda wait: False)
    assert r.hget(f"b-{b.bid}", "pending") == "1" and not r.exists(f"b-{b.bid}-success")
    worker_side.failed(runtime_for(config), job, ValueError("late"),  # after success: ignored
                       "retry", lambda wait: False)
    assert r.scard(f"b-{b.bid}-failed") == 0
    worker_side.succeeded(runtime_for(config), {"jid": other, "bid": b.bid}, lambda wait: False)
    assert r.exists(f"b-{b.bid}-success") and r.llen("queue:default") == 3  # 2 jobs, 1 callback


def test_callbacks_carry_sidekiq_8_millisecond_timestamps_when_configured(
        config: Config, r: redis.Redis, define: Define) -> None:
    ms = dataclasses.replace(config, timestamps="ms")
    b = wurk.Batch(on_complete=(define(lambda status, x: None), [1]), client=wurk.Client(ms))
    b.commit()
    [raw] = r.lrange("queue:default", 0, -1)
    payload = json.loads(raw)
    assert isinstance(payload["enqueued_at"], int) and isinstance(payload["created_at"], int)
    assert abs(payload["enqueued_at"] / 1000 - time.time()) < 5
    assert payload["args"][1:] == [1] and payload["args"][0]["event"] == "complete"
    assert "bid" not in payload  # a top-level batch's callbacks belong to no batch
    close_runtime(ms)


def test_a_death_in_a_child_fires_death_in_the_parent_too(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    def bad() -> None:
        raise RuntimeError("dies")
    dies = define(bad, retry=False)
    died = recorder(define, r, "died")
    with wurk.Batch(on_death=(died, ["parent"])) as parent, \
            wurk.Batch(on_death=(died, ["child"])) as child:
        child.add(dies)
    launch()
    wait_for(lambda: r.llen("died") == 2)
    assert sorted(c[1] for c in calls(r, "died")) == ["child", "parent"]
    assert {c[0]["bid"] for c in calls(r, "died")} == {parent.bid, child.bid}


def test_an_unknown_callback_job_in_the_worker_is_an_ordinary_failure(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    gone = define(lambda status: None)
    ran = define(lambda tag: r.rpush("ran", tag))
    b = wurk.Batch(on_success=gone)
    wurk.registry.discard(gone.name)  # the worker does not know it
    b.commit()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, what="the callback in the retry set")
    assert json.loads(r.zrange("retry", 0, -1)[0])["class"] == gone.name
    ran.perform_async("still working")
    wait_for(lambda: r.lrange("ran", 0, -1) == ["still working"])


def test_a_reopened_batch_whose_block_raises_lets_go(
        config: Config, r: redis.Redis, define: Define) -> None:
    done = recorder(define, r, "cb")
    b = wurk.Batch(on_complete=done)
    b.commit()
    r.delete("queue:default")
    later = wurk.Batch(on_complete=done)
    with pytest.raises(KeyError), wurk.Batch.reopen(later.bid) as again:
        assert wurk.Batch.current() is again
        raise KeyError("in the block")
    assert wurk.Batch.current() is None
    later.commit()
    assert r.exists(f"b-{later.bid}-complete") and not r.hget(f"b-{later.bid}", "aborted")


def test_a_scheduled_job_is_counted_when_pushed_and_holds_the_batch_until_it_runs(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    # The job notes when it ran and how many callbacks had fired by then.
    later = define(lambda: r.rpush("ran", json.dumps([time.time(), r.llen("cb")])))
    done = recorder(define, r, "cb")
    launch()
    at = time.time() + 1.0
    with wurk.Batch(on_success=done) as b:
        b.push({"class": later.name, "args": [], "at": at})
    assert r.zcard("schedule") == 1 and r.hget(f"b-{b.bid}", "pending") == "1"
    wait_for(lambda: r.llen("cb") == 1, timeout=10)
    [(ran_at, callbacks_before)] = [json.loads(x) for x in r.lrange("ran", 0, -1)]
    # It ran when due, and the batch waited for it: no callback before it ran.
    assert ran_at >= at and callbacks_before == 0


def test_through_a_redis_outage_the_worker_retries_the_count_until_a_stop_abandons_it(
        config: Config, r: redis.Redis) -> None:
    from conftest import free_port

    from wurk.batches import step as worker_side

    away = Config(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_retry_attempts=1,
                  redis_connect_timeout=0.2, redis_retry_base=0.01, redis_retry_cap=0.02,
                  log_level="warning")
    waits: list[float] = []

    def abandoned(wait: float) -> bool:
        waits.append(wait)
        return len(waits) == 3  # a hard stop on the third wait
    job = {"jid": "j" * 24, "bid": "some-batch"}
    try:
        assert worker_side.succeeded(runtime_for(away), job, abandoned) is False
        assert len(waits) == 3 and all(0 < w < 0.1 for w in waits)
        waits.clear()
        worker_side.failed(runtime_for(away), job, ValueError("x"), "dead", abandoned)
        assert len(waits) == 3
    finally:
        close_runtime(away)


def test_a_new_bid_never_reads_as_a_command_line_option() -> None:
    from wurk.batches.keys import new_bid
    bids = [new_bid() for _ in range(20_000)]  # about 300 would start with "-" before
    assert all(len(b) == 14 and not b.startswith("-") for b in bids)

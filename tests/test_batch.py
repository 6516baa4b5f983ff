"""Batches in one process: counters, callbacks and their status argument,
nesting, jobs added from inside, failures then success on retry, death.
Real Redis, an in-process Launcher running the jobs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.settings.config import Config

Define = Callable[..., JobFunction[..., Any]]
_r: redis.Redis | None = None


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

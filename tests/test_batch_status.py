"""Batch status (wurk.api.BatchSet/BatchStatus), ``wurk batches``, expiry and
abandonment, and bad input: unknown callback jobs, non-JSON arguments and
workflow data, garbage batch records in Redis. Real Redis, an in-process
Launcher where jobs must run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli
from waiting import wait_for

import wurk
from wurk.api import BatchSet, BatchStatus
from wurk.push.job import JobFunction
from wurk.settings.config import Config

Define = Callable[..., JobFunction[..., Any]]
keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def test_the_status_shows_counts_failures_children_and_callbacks(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    def bad(n: int) -> None:
        raise KeyError(f"row {n}")
    failing = define(bad, retry_in=lambda *a: 3600)
    ok = define(lambda: None)
    done = define(lambda status: None)
    with wurk.Batch("nightly", on_complete=(done, [1]), workflow={"w": [1]}) as b:
        jid = b.add(failing, 4)
        b.add(ok)
        child = wurk.Batch("child")
        child.commit()
    status = BatchStatus.read(b.bid)
    assert status.state == "running" and status.total == 2 and status.pending == 2
    assert status.children == [child.bid]
    assert BatchStatus.read(child.bid).parent_bid == b.bid
    assert status.callbacks == {"complete": [{"job": done.name, "queue": "default",
                                              "args": [1]}]}
    launch()
    wait_for(lambda: BatchStatus.read(b.bid).complete, what="complete")
    status = BatchStatus.read(b.bid)
    assert status.state == "complete" and status.pending == 1 and status.failures == 1
    assert status.failed == [{"jid": jid, "class": "KeyError", "message": "'row 4'",
                              "retry_count": 0}]
    assert status.workflow == {"w": [1]} and status.fired["success"] is None
    assert status.created_at <= status.fired["complete"] <= time.time()  # type: ignore[operator]
    assert [s.bid for s in BatchSet().list()] == [child.bid, b.bid]


def test_an_unfinished_batch_with_no_progress_shows_abandoned(
        config: Config, r: redis.Redis, define: Define) -> None:
    b = wurk.Batch("left open")
    b.add(define(lambda: None))
    assert BatchStatus.read(b.bid).state == "building"
    r.hset(f"b-{b.bid}", "updated_at", str(time.time() - 7200))
    assert BatchSet(abandoned_after=3600).get(b.bid).state == "abandoned"
    assert BatchSet().get(b.bid).state == "building"  # a day by default
    b.commit()


def test_an_unfinished_batch_expires_and_the_listing_skips_it(
        config: Config, r: redis.Redis, define: Define) -> None:
    b = wurk.Batch(expires_in=1)
    assert 0 < r.ttl(f"b-{b.bid}") <= 1
    with pytest.raises(wurk.BatchError, match="expires_in"):
        wurk.Batch(expires_in=0)
    wait_for(lambda: not r.exists(f"b-{b.bid}"), timeout=5)
    assert not BatchStatus.read(b.bid).exists and BatchSet().list() == []
    with pytest.raises(wurk.BatchError, match="does not exist"):
        b.add(define(lambda: None))
    with pytest.raises(wurk.BatchError, match="does not exist"):
        wurk.Batch.reopen(b.bid)


def test_a_block_that_raises_aborts_the_batch_and_nothing_fires(
        config: Config, r: redis.Redis, define: Define) -> None:
    done = define(lambda status: r.incr("fired"))
    with pytest.raises(ZeroDivisionError), wurk.Batch(on_complete=done) as b:
        b.add(define(lambda: None))
        _ = 1 / 0
    status = BatchStatus.read(b.bid)
    assert status.state == "aborted" and "ZeroDivisionError" in (status.aborted or "")
    assert status.holds == 1 and not r.exists(f"b-{b.bid}-complete")


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"on_success": "no_such_job"}, "unknown job 'no_such_job'"),
    ({"on_success": print}, "must be a @wurk.job function"),
    ({"on_complete": ("JOB", {"not": "a list"})}, "takes a job or"),
    ({"on_complete": ()}, "takes a job or"),
    ({"on_complete": ("JOB", [object()])}, "JSON"),
    ({"workflow": {"x": float("nan")}}, "workflow data must be JSON"),
    ({"description": 5}, "description must be a str"),
    ({"parent": 7}, "parent must be"),
    ({"parent": "missing-bid"}, "parent batch missing-bid does not exist"),
])
def test_bad_batch_arguments_are_refused_before_anything_is_written(
        kwargs: dict[str, Any], error: str, config: Config, r: redis.Redis,
        define: Define) -> None:
    job = define(lambda status: None)
    kwargs = {k: ((job, v[1]) if isinstance(v, tuple) and v else v) for k, v in kwargs.items()}
    with pytest.raises((wurk.BatchError, wurk.ArgumentError), match=error):
        wurk.Batch(**kwargs)
    assert r.keys("b-*") == [] and r.zcard("batches") == 0


def test_bad_job_arguments_push_nothing_and_count_nothing(
        config: Config, r: redis.Redis, define: Define) -> None:
    with wurk.Batch() as b:
        with pytest.raises(wurk.ArgumentError):
            b.add(define(lambda x: None), {1, 2})
        with pytest.raises(wurk.BatchError, match="unknown job"):
            b.add("nope")
    assert r.hget(f"b-{b.bid}", "total") == "0" and r.llen("queue:default") == 0
    with pytest.raises(wurk.BatchError, match="bid"):
        wurk.Client(config).push({"class": "X", "args": [], "bid": 12})
    assert r.llen("queue:default") == 0


def test_a_garbage_batch_record_never_kills_a_worker(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    ran = define(lambda tag: r.rpush("ran", tag))
    broken = wurk.Batch()
    broken.add(ran, "broken")
    r.delete(f"b-{broken.bid}-failed")
    r.set(f"b-{broken.bid}-failed", "not a set")
    r.hset(f"b-{broken.bid}", mapping={"total": "many", "cbt": "{not json", "workflow": "[1,"})
    launch()
    wait_for(lambda: r.llen("ran") == 1)
    status = BatchStatus.read(broken.bid)
    assert any("WRONGTYPE" in p for p in status.problems)
    assert any("total is not a number" in p for p in status.problems)
    with pytest.raises(wurk.BatchError, match="failed is a string"):
        broken.commit()
    # The same worker threads go on running jobs, batch or not.
    callback = define(lambda status, tag: r.rpush("ran", tag))
    with wurk.Batch(on_success=(callback, ["callback"])) as fine:
        fine.add(ran, "after")
    wait_for(lambda: sorted(r.lrange("ran", 0, -1)) == ["after", "broken", "callback"])
    assert BatchStatus.read(fine.bid).state == "success"
    # Garbage callback templates push nothing, and unknown callbacks fail as jobs.
    odd = wurk.Batch()
    r.hset(f"b-{odd.bid}", "cbt", json.dumps({"success": [[1, 2], "x", ["q", "h", "", "j"]]}))
    odd.commit()
    assert r.exists(f"b-{odd.bid}-success") and r.llen("queue:q") == 0


def test_wurk_batches_lists_and_shows(cli: Cli, config: Config, r: redis.Redis,
                                      define: Define) -> None:
    b = wurk.Batch("the import")
    b.add(define(lambda: None))
    listed = cli("batches", "--json")
    assert listed.code == 0, listed.err
    [row] = listed.json["batches"]
    assert (row["bid"], row["state"], row["total"], row["pending"]) == (b.bid, "building", 1, 1)
    assert "the import" in cli("batches").out
    shown = cli("batches", "show", b.bid, "--json")
    assert shown.code == 0 and shown.json["batch"]["description"] == "the import"
    assert "pending" in cli("batches", "show", b.bid).out
    assert cli("batches", "show", "nope").code == 1
    assert cli("batches", "show").code == 2
    assert cli("batches", "--abandoned-after", "0").code == 2
    b.commit()


def test_a_raw_push_with_an_unknown_bid_goes_through_uncounted(
        config: Config, r: redis.Redis) -> None:
    jid = wurk.Client(config).push({"class": "X", "args": [], "bid": "b-from-sidekiq-pro"})
    assert json.loads(r.lrange("queue:default", 0, -1)[0])["jid"] == jid
    assert r.keys("b-*") == []
    b = wurk.Batch()
    b.commit()
    with pytest.raises(wurk.BatchError, match="already succeeded"):
        wurk.Client(config).push({"class": "X", "args": [], "bid": b.bid})

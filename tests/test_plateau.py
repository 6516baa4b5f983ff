"""Steady work reaches a plateau: the indexes and markers wurk writes are bounded.

After N finished batches and workflows and their linger passing, the
``batches`` and ``wurk:workflows`` indexes and the batch markers hold the
unfinished ones only; fired markers live no longer than their batch; a
replay once a batch is gone fires nothing; results stored only for a later
workflow step go when the workflow ends. Real Redis, an in-process Launcher.

Time passing is :func:`a_day_passes`: every key due to expire within a day
(and a margin) is deleted, as Redis would have expired it, and every
retire-at score moves back a day, as the clock would have moved forward.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import redis
from waiting import wait_for

import wurk
from wurk.batches import keys as batch_keys
from wurk.batches.lua import FAILED, SUCCEEDED
from wurk.push.job import JobFunction
from wurk.results import records as results_wire
from wurk.settings.config import Config
from wurk.workflows import keys as wf_wire

Define = Callable[..., JobFunction[..., Any]]
DAY = 24 * 3600
MARGIN = 600  # seconds past the day: a marker's margin, slow test machines
# The format's names (docs/reference/redis-format.md), spelled out as a Ruby client would.
BATCHES_RETIRE, WORKFLOWS_RETIRE = "wurk:batches:retire", "wurk:workflows:retire"
DRAIN, MARKER_MARGIN_MS = 100, 60_000


def a_day_passes(r: redis.Redis) -> None:
    for name in r.scan_iter(count=1000):
        if 0 <= r.pttl(name) <= (DAY + MARGIN) * 1000:
            r.delete(name)
    for retire in (BATCHES_RETIRE, WORKFLOWS_RETIRE):
        for member, score in r.zrange(retire, 0, -1, withscores=True):
            r.zadd(retire, {member: score - DAY - MARGIN})


def script(r: redis.Redis, which: Any, *argv: Any) -> Any:
    return r.eval(which.source, 0, *argv)


def finished_batches(r: redis.Redis, define: Define, n: int) -> list[str]:
    """N empty batches: each fires complete and success at commit."""
    done = define(lambda status: None)
    bids = []
    for _ in range(n):
        b = wurk.Batch("finished", on_success=done)
        b.commit()
        bids.append(str(b.bid))
    wait_for(lambda: all(r.exists(batch_keys.key(b, "success")) for b in bids),
             what="every batch succeeded")
    return bids


def unfinished_batches(define: Define, n: int) -> list[str]:
    parked = define(lambda: None, queue="parked")  # no worker reads "parked"
    bids = []
    for _ in range(n):
        with wurk.Batch("unfinished") as b:
            b.add(parked)
        bids.append(str(b.bid))
    return bids


def test_the_batches_index_and_markers_come_back_to_the_unfinished_batches(
        config: Config, r: redis.Redis, define: Define) -> None:
    finished = finished_batches(r, define, 30)
    unfinished = unfinished_batches(define, 3)
    assert r.zcard(batch_keys.INDEX) == 33
    a_day_passes(r)
    latest = unfinished_batches(define, 1)  # a create retires what is due
    live = set(unfinished + latest)
    assert set(r.zrange(batch_keys.INDEX, 0, -1)) == live
    assert set(r.zrange(BATCHES_RETIRE, 0, -1)) == live
    assert not [b for b in finished if r.exists(*batch_keys.all_keys(b))]


def test_a_create_retires_a_bounded_number_and_keeps_a_batch_whose_hash_lives(
        config: Config, r: redis.Redis, define: Define) -> None:
    finished = finished_batches(r, define, DRAIN + 5)
    kept = finished[0]
    r.persist(batch_keys.key(kept))  # changed by hand: its hash outlives the linger
    a_day_passes(r)
    r.zadd(BATCHES_RETIRE, {kept: 0})  # first in line
    unfinished_batches(define, 1)
    assert r.zcard(batch_keys.INDEX) == 1 + 5 + 1  # kept, 5 not yet drained, the new one
    assert r.zscore(batch_keys.INDEX, kept) is not None
    assert r.zscore(BATCHES_RETIRE, kept) > r.time()[0]  # looked at again later
    unfinished_batches(define, 1)
    assert r.zcard(batch_keys.INDEX) == 1 + 2


def test_fired_markers_live_as_long_as_their_batch_and_no_longer(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    flaky = define(lambda: 1 / 0, retry=False)
    with wurk.Batch("one hour", expires_in=3600) as failing:
        failing.add(flaky)
    [ok] = finished_batches(r, define, 1)
    launch()
    wait_for(lambda: r.exists(batch_keys.key(failing.bid, "complete")), what="complete fired")
    for bid, event in ((failing.bid, "complete"), (failing.bid, "death"), (ok, "complete"),
                       (ok, "success")):
        hash_ms, marker_ms = r.pttl(batch_keys.key(bid)), r.pttl(batch_keys.key(bid, event))
        assert hash_ms > 0 and hash_ms <= marker_ms <= hash_ms + MARKER_MARGIN_MS
    assert r.pttl(batch_keys.key(ok)) <= DAY * 1000  # success: every key lingers a day


def test_a_replay_once_the_batch_is_gone_fires_no_callback_twice(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    work = define(lambda: None)
    done = define(lambda status: r.incr("callbacks"))
    with wurk.Batch("replayed", on_success=done, on_complete=done, on_death=done) as b:
        jid = b.add(work)
    worker = launch()
    wait_for(lambda: r.get("callbacks") == "2", what="complete and success ran")
    worker.stop(time.monotonic() + 10)
    a_day_passes(r)
    assert not r.exists(*batch_keys.all_keys(b.bid))
    # A completion replayed after the batch's keys (markers too) expired: nothing fires.
    assert script(r, SUCCEEDED, b.bid, jid) == -1
    assert script(r, FAILED, b.bid, jid, json.dumps({"class": "X"}), "1") == -1
    assert r.llen("queue:default") == 0 and r.get("callbacks") == "2"
    assert not r.exists(*batch_keys.all_keys(b.bid))


def test_the_workflows_index_comes_back_to_the_unfinished_workflows(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    first, then = define(lambda n: n), define(lambda n: n)
    parked = define(lambda: None, queue="parked")
    done = [wurk.Workflow(wurk.step(first, n) >> wurk.step(then, n)).start() for n in range(20)]
    launch()
    wait_for(lambda: all(r.hget(wf_wire.key(w), "state") == "succeeded" for w in done),
             what="every workflow finished")
    running = [wurk.Workflow(wurk.step(parked)).start() for _ in range(2)]
    assert r.zcard(wf_wire.INDEX) == 22
    a_day_passes(r)
    running.append(wurk.Workflow(wurk.step(parked)).start())  # a start retires what is due
    assert set(r.zrange(wf_wire.INDEX, 0, -1)) == set(running)
    assert set(r.zrange(WORKFLOWS_RETIRE, 0, -1)) == set(running)


def test_results_kept_only_for_a_later_step_go_when_the_workflow_ends(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    produce = define(lambda n: n * 2)
    asked = define(lambda n: n * 3, store_result=True, result_ttl=600)
    consume = define(lambda got: sum(got.values()))
    flow = [wurk.step(produce, 1), wurk.step(asked, 1)] >> wurk.step(consume, results=True)
    wid = wurk.Workflow(flow, result_ttl=7200).start()
    launch()
    wait_for(lambda: wurk.Workflow.status(wid).finished, what="the workflow finished")
    jids = {name: json.loads(raw) for name, raw in r.hgetall(wf_wire.key(wid, "jids")).items()}
    [produced], [kept] = jids[produce.name], jids[asked.name]
    assert not r.exists(results_wire.key(produced), results_wire.ready_key(produced))
    assert 3600 < r.ttl(results_wire.key(kept)) <= 7200  # asked: the longer of the two
    # the last step's job asked for nothing and feeds no step: nothing stored
    [last] = jids[consume.name]
    assert not r.exists(results_wire.key(last))


def test_a_result_passed_between_steps_lives_no_longer_than_the_workflow(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    produce = define(lambda n: n * 2)
    parked = define(lambda got: None, queue="parked")
    wid = wurk.Workflow(wurk.step(produce, 1) >> wurk.step(parked, results=True),
                        expires_in=900).start()
    launch()
    wait_for(lambda: r.hexists(wf_wire.key(wid, "launched"), parked.name),
             what="the consuming step launched")
    [produced] = json.loads(r.hget(wf_wire.key(wid, "jids"), produce.name))
    assert 0 < r.ttl(results_wire.key(produced)) <= 900


def test_the_batch_linger_setting_bounds_finished_batches_and_workflows(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    short = wurk.Client(dataclasses.replace(config, batch_linger=60))
    done = define(lambda status: None)
    b = wurk.Batch("short", on_success=done, client=short)
    b.commit()
    work = define(lambda: None)
    wid = wurk.Workflow(wurk.step(work), client=short).start()
    launch()
    wait_for(lambda: r.hget(wf_wire.key(wid), "state") == "succeeded", what="workflow done")
    wait_for(lambda: 0 < r.ttl(batch_keys.key(wid)) <= 60, what="the root lingers a minute")
    for key in (batch_keys.key(b.bid), wf_wire.key(wid), wf_wire.key(wid, "ends")):
        assert 0 < r.ttl(key) <= 60
    assert 0 < r.pttl(batch_keys.key(b.bid, "success")) <= 60_000 + MARKER_MARGIN_MS
    now = r.time()[0]
    assert r.zscore(BATCHES_RETIRE, b.bid) <= now + 60
    assert r.zscore(WORKFLOWS_RETIRE, wid) <= now + 61

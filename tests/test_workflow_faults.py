"""Workflow and batch launches under faults: a real process SIGKILLed at each
point of a launch (stopped there by the module's hook), lost replies while a
workflow starts and while a batch is made and let go. A launch is one script
(a step) or one MULTI/EXEC of guarded scripts (a start): a kill leaves all of
it or none, and a rerun or replay writes nothing twice. Real Redis."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from waiting import wait_for

import wurk
from tests.faultproxy import FaultProxy
from wurk.push.job import JobFunction
from wurk.settings.config import Config
from wurk.workflows import client as workflow_module
from wurk.workflows.client import advance

Define = Callable[..., JobFunction[..., Any]]


def finished(wid: str) -> Any:
    wait_for(lambda: wurk.Workflow.status(wid).finished, what=f"workflow {wid} finished")
    return wurk.Workflow.status(wid)


def jobs_of(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [p for p in (json.loads(x) for x in r.lrange("queue:default", 0, -1))
            if p["class"] == name]


def killed_at(point: str, act: Callable[[], object]) -> None:
    """Run ``act`` in a forked child stopped at the hook's ``point``, then SIGKILL it."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)

        def stop(reached: str) -> None:
            if reached == point:
                os.write(wfd, b"x")
                signal.pause()  # SIGKILLed here
        workflow_module._hook = stop
        try:
            act()
        finally:
            os._exit(3)  # never reached the point
    os.close(wfd)
    try:
        assert os.read(rfd, 1) == b"x", f"the child never reached {point!r}"
        os.kill(pid, signal.SIGKILL)
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.fixture
def two_steps(config: Config, r: redis.Redis, define: Define) -> Iterator[tuple[Any, Any]]:
    first = define(lambda: r.incr("first"))
    second = define(lambda n: r.incr("second"))
    yield first, second


@pytest.mark.parametrize("point", ["launch", "launched"])
def test_an_advance_killed_at_each_point_of_a_launch_is_rerun_to_the_end_once(
        r: redis.Redis, two_steps: tuple[Any, Any], launch: Callable[..., Any],
        point: str) -> None:
    first, second = two_steps
    wid = wurk.Workflow(wurk.step(first, name="one")
                        >> wurk.group(second, [[1], [2], [3]], name="two")).start()
    r.delete("queue:default")  # step one's job: its end is faked below
    killed_at(point, lambda: advance({}, wid, "one", "success"))
    launched = jobs_of(r, second.name)
    # The launch is one script: before it nothing, after it all three, counted.
    assert len(launched) == (3 if point == "launched" else 0)
    assert r.scard(f"b-{wid}.1-jids") == len(launched)
    assert r.exists(f"b-{wid}.1") == (point == "launched")
    advance({}, wid, "one", "success")  # the rerun, as reliable fetch recovery makes it
    again = jobs_of(r, second.name)
    assert len(again) == 3 and {p["jid"] for p in launched} <= {p["jid"] for p in again}
    assert r.hget(f"b-{wid}.1", "total") == "3"
    launch()
    assert finished(wid).state == "succeeded"
    assert r.get("second") == "3" and r.get("first") is None


def test_a_start_killed_before_its_transaction_leaves_nothing(
        r: redis.Redis, two_steps: tuple[Any, Any]) -> None:
    first, second = two_steps
    flow = wurk.Workflow(wurk.step(first, name="one") >> wurk.step(second, 1, name="two"))
    killed_at("start", flow.start)
    assert r.dbsize() == 0  # no orphan root batch, no half-made workflow keys


def test_a_started_workflow_runs_even_if_its_starter_dies_at_once(
        r: redis.Redis, two_steps: tuple[Any, Any], launch: Callable[..., Any]) -> None:
    first, second = two_steps
    flow = wurk.Workflow(wurk.step(first, name="one") >> wurk.step(second, 1, name="two"))
    killed_at("started", flow.start)
    wid = flow._wid
    assert len(jobs_of(r, first.name)) == 1 and r.hget(f"b-{wid}.0", "total") == "1"
    assert r.ttl(f"wurk:wf:{wid}:jids") > 0 and r.ttl(f"wurk:wf:{wid}:steps") > 0
    launch()
    assert finished(wid).state == "succeeded"
    assert r.get("first") == "1" and r.get("second") == "1"


def test_a_start_whose_reply_is_lost_is_replayed_and_launches_once(
        proxy: FaultProxy, r: redis.Redis, two_steps: tuple[Any, Any],
        launch: Callable[..., Any]) -> None:
    first, second = two_steps
    client = wurk.Client(Config(redis_url=proxy.url, redis_retry_base=0.01,
                                log_level="warning"), buffered=False, drain_spool=False)
    flow = wurk.Workflow(wurk.step(first, name="one") >> wurk.step(second, 1, name="two"),
                         client=client)
    client.pool.call("PING")  # a warm connection: the fault hits the transaction
    proxy.drop_next_reply()
    wid = flow.start()  # replayed: every part finds its guard
    assert flow.start() == wid  # and again by hand: the same workflow, nothing new
    assert len(jobs_of(r, first.name)) == 1 and r.hget(f"b-{wid}.0", "total") == "1"
    assert r.zcard("wurk:workflows") == 1 and r.scard(f"b-{wid}-kids") == 1
    launch()
    assert finished(wid).state == "succeeded"
    assert r.get("first") == "1" and r.get("second") == "1"


def test_a_batch_made_and_let_go_through_lost_replies_completes_once(
        proxy: FaultProxy, r: redis.Redis, config: Config, define: Define,
        launch: Callable[..., Any]) -> None:
    done = define(lambda status: r.rpush("fired", status["bid"]))
    work = define(lambda: r.incr("ran"))
    client = wurk.Client(Config(redis_url=proxy.url, redis_retry_base=0.01,
                                log_level="warning"), buffered=False, drain_spool=False)
    client.pool.call("PING")
    proxy.drop_next_reply()  # the create script ran; replayed, it finds its own hold
    batch = wurk.Batch("lost replies", on_success=done, client=client)
    batch.add(work)
    proxy.drop_next_reply()  # the commit ran; replayed, the hold is already gone
    batch.commit()
    assert r.zcard("batches") == 1 and r.hget(f"b-{batch.bid}", "total") == "1"
    launch()
    wait_for(lambda: r.llen("fired") == 1, what="the success callback")
    assert r.lrange("fired", 0, -1) == [batch.bid] and r.get("ran") == "1"


def test_a_step_launched_by_an_earlier_wurk_is_let_go_not_relaunched(
        r: redis.Redis, two_steps: tuple[Any, Any]) -> None:
    first, second = two_steps
    wid = wurk.Workflow(wurk.step(first, name="one")
                        >> wurk.group(second, [[1], [2]], name="two")).start()
    # What the earlier launch left: the step's batch, held by its own hold, no guard.
    wurk.Batch("old launch", parent=wid, _fixed=(f"{wid}.1", workflow_module.LEGACY_STEP_HOLD))
    advance({}, wid, "one", "success")
    assert not r.sismember(f"b-{wid}.1-jids", workflow_module.LEGACY_STEP_HOLD)
    assert jobs_of(r, second.name) == []  # not pushed a second time

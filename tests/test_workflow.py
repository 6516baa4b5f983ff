"""Workflows in one process: a chain passing results, a chord of 1,000, a diamond,
validation that pushes nothing, the stop and continue policies, missing
results, replays of the advance job. Real Redis, an in-process Launcher."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.settings.config import Config
from wurk.workflows import client as workflow_module
from wurk.workflows import keys as wire
from wurk.workflows.client import advance

Define = Callable[..., JobFunction[..., Any]]
cli = admin_cli.cli
keep_logging = admin_cli.keep_logging


def finished(wid: str) -> wurk.workflows.status.WorkflowStatus:  # type: ignore[name-defined]
    wait_for(lambda: wurk.Workflow.status(wid).finished, what=f"workflow {wid} finished")
    return wurk.Workflow.status(wid)


def test_a_chain_of_three_passes_results(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    first = define(lambda n: n + 1)
    second = define(lambda got, k: got * k)
    third = define(lambda got: r.rpush("out", got) and f"total {got}")
    flow = (wurk.step(first, 1) >> wurk.step(second, 10, results=True)
            >> wurk.step(third, results=True))
    wid = wurk.Workflow(flow, description="chain").start()
    assert r.exists(f"b-{wid}") and r.hget(wire.key(wid), "state") == "running"
    launch()
    status = finished(wid)
    assert status.state == "succeeded" and r.lrange("out", 0, -1) == ["20"]
    assert [s.state for s in status.steps.values()] == ["succeeded"] * 3
    assert status.failures == [] and status.description == "chain"
    wait_for(lambda: r.exists(f"b-{wid}-complete"), what="the root batch completed")
    assert r.hlen(wire.key(wid, "ends")) == 3


def test_a_chord_of_a_thousand_gets_every_result(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    square = define(lambda n: n * n)
    total = define(lambda got: r.set("sum", json.dumps([len(got), sum(got)])))
    flow = wurk.group(square, [[n] for n in range(1000)]) >> wurk.step(total, results=True)
    wid = wurk.Workflow(flow).start()
    launch()
    status = finished(wid)
    assert status.state == "succeeded"
    assert json.loads(r.get("sum")) == [1000, sum(n * n for n in range(1000))]
    assert status.steps[square.name].jobs == 1000


def test_a_diamond_joins_both_branches_once(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    fetch = define(lambda: "data")
    left = define(lambda got: r.rpush("ran", "left") and f"L:{got}")
    right = define(lambda got: r.rpush("ran", "right") and f"R:{got}")
    join = define(lambda got: r.rpush("ran", json.dumps(got)))
    flow = (wurk.step(fetch) >> [wurk.step(left, results=True), wurk.step(right, results=True)]
            >> wurk.step(join, results=True))
    wid = wurk.Workflow(flow).start()
    launch()
    assert finished(wid).state == "succeeded"
    ran = r.lrange("ran", 0, -1)
    assert sorted(ran[:2]) == ["left", "right"] and len(ran) == 3
    assert json.loads(ran[2]) == {left.name: "L:data", right.name: "R:data"}


def test_the_dict_form_runs_too(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    one = define(lambda tag: r.rpush("ran", tag))
    wid = wurk.Workflow({"a": {"job": one.name, "args": [["a"]]},
                         "b": {"job": one.name, "args": [["b1"], ["b2"]], "after": ["a"]}}).start()
    launch()
    assert finished(wid).state == "succeeded"
    ran = r.lrange("ran", 0, -1)
    assert ran[0] == "a" and sorted(ran[1:]) == ["b1", "b2"]


@pytest.mark.parametrize(("spec", "message"), [
    ({"a": {"job": "J", "after": ["b"]}, "b": {"job": "J", "after": ["a"]}}, "cycle"),
    ({"a": {"job": "no_such_job"}}, "unknown job"),
    ({"a": {"job": "J", "args": [[{1, 2}]]}}, "JSON"),
    ({"a": {"job": "J", "args": [[float("nan")]]}}, "step 'a'"),
    ({"a": {"job": "J", "after": ["zz"]}}, "no step"),
    ({"a": {"job": "J", "args": [[1, 2, 3]]}}, "takes"),
    ({"a": {"job": "J", "results": True}}, "runs after no step"),
    ({}, "non-empty"),
])
def test_a_bad_definition_pushes_nothing(config: Config, r: redis.Redis, define: Define,
                                         spec: dict[str, Any], message: str) -> None:
    one = define(lambda x=None: None)
    text = json.dumps(spec, default=str).replace('"J"', json.dumps(one.name))
    spec = json.loads(text) if "{1, 2}" not in str(spec) and "nan" not in str(spec) else {
        name: {**body, "job": one.name} for name, body in spec.items()}
    with pytest.raises(wurk.WorkflowError, match=message):
        wurk.Workflow(spec).start()
    assert r.dbsize() == 0


def test_composition_cycles_and_bad_steps_are_refused(config: Config, define: Define) -> None:
    one = define(lambda: None)
    a, b = wurk.step(one), wurk.step(one)
    with pytest.raises(wurk.WorkflowError, match="cycle"):
        wurk.Workflow(a >> b >> a)
    with pytest.raises(wurk.WorkflowError, match="made of"):
        wurk.Workflow(a >> "not a step")
    with pytest.raises(wurk.WorkflowError, match="policy"):
        wurk.Workflow(a, policy="sometimes")
    with pytest.raises(wurk.WorkflowError, match="non-empty list"):
        wurk.group(one, [])


def test_stop_policy_stops_after_a_death(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    ok = define(lambda tag: r.rpush("ran", tag))

    def boom() -> None:
        raise ValueError("bad shard")
    bad = define(boom, retry=False)
    after_bad = wurk.step(ok, "after-bad", name="after-bad")
    flow = (wurk.step(ok, "a") >> [wurk.step(bad, name="bad") >> after_bad,
                                   wurk.step(ok, "b") >> wurk.step(ok, "c", name="c")])
    wid = wurk.Workflow(flow, policy="stop").start()
    launch()
    status = finished(wid)
    assert status.state == "stopped" and status.stopped_by == "bad"
    assert status.steps["bad"].state == "failed"
    assert status.steps["bad"].error is not None
    assert status.steps["bad"].error["message"] == "bad shard"
    assert "after-bad" not in r.lrange("ran", 0, -1)
    assert [s.name for s in status.failures] == ["bad"]
    # The dead job retried by hand from the morgue, then succeeding: the first end stands.
    advance({}, wid, "bad", "success")
    assert wurk.Workflow.status(wid).steps["bad"].state == "failed"
    assert r.hget(wire.key(wid, "owner"), "after-bad") is None


def test_continue_policy_runs_independent_branches_and_reports(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    ok = define(lambda tag: r.rpush("ran", tag))

    def boom() -> None:
        raise ValueError("bad shard")
    bad = define(boom, retry=False)
    gate = define(lambda tag: r.blpop("go", timeout=5) and r.rpush("ran", tag))
    flow = (wurk.step(ok, "a") >> [wurk.step(bad, name="bad") >> wurk.step(ok, "x", name="x"),
                                   wurk.step(gate, "b") >> wurk.step(ok, "c", name="c")])
    wid = wurk.Workflow(flow, policy="continue").start()
    launch()
    wait_for(lambda: wurk.Workflow.status(wid).steps["bad"].state == "failed")
    r.rpush("go", 1)  # the independent branch finishes after the failure
    status = finished(wid)
    assert status.state == "failed" and status.stopped_by is None
    assert status.steps["c"].state == "succeeded" and status.steps["x"].state == "skipped"
    assert r.lrange("ran", 0, -1) == ["a", "b", "c"]


def test_a_missing_result_fails_the_step_with_a_clear_error(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    mid = define(lambda: "x")
    wipe = define(lambda: r.delete(*(r.keys("wurk:result:*") or ["none"])))
    last = define(lambda got: r.set("last ran", 1))
    # "del" runs after "mid" and deletes mid's stored result before "last" needs it.
    wid = wurk.Workflow({"mid": {"job": mid.name},
                         "del": {"job": wipe.name, "after": ["mid"]},
                         "last": {"job": last.name, "after": ["mid", "del"], "results": True}},
                        policy="continue").start()
    launch()
    status = finished(wid)
    assert status.state == "failed" and not r.exists("last ran")
    error = status.steps["last"].error
    assert error is not None and error["class"] == "wurk.MissingResult"
    assert "expired" in error["message"] and "'mid'" in error["message"]


def test_replayed_advance_calls_launch_nothing_twice(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any]) -> None:
    first = define(lambda: r.incr("first"))
    second = define(lambda: r.incr("second"))
    wid = wurk.Workflow(wurk.step(first, name="one") >> wurk.step(second, name="two")).start()
    launch()
    status = finished(wid)
    assert status.state == "succeeded"
    # A rerun of the callback (reliable-fetch recovery after a SIGKILL): nothing moves.
    bid = status.steps["one"].bid
    advance({"bid": bid}, wid, "one", "success")
    advance({"bid": status.steps["two"].bid}, wid, "two", "success")
    assert r.get("first") == "1" and r.get("second") == "1"
    assert r.llen("queue:default") == 0
    with pytest.raises(wurk.WorkflowError, match="no step"):
        advance({}, wid, "nope", "success")
    with pytest.raises(wurk.WorkflowError, match="does not exist"):
        wurk.Workflow.status("gone")


def test_an_advance_that_dies_mid_launch_is_replayed_without_a_double_push(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = define(lambda: r.incr("first"))
    second = define(lambda n: r.incr("second"))
    wid = wurk.Workflow(wurk.step(first, name="one")
                        >> wurk.group(second, [[1], [2], [3]], name="two")).start()

    def dies_after_the_launch(point: str) -> None:
        if point == "launched":
            raise ConnectionError("killed after the launch, before the advance finished")
    monkeypatch.setattr(workflow_module, "_hook", dies_after_the_launch)
    with pytest.raises(ConnectionError):
        advance({}, wid, "one", "success")  # as if step one had succeeded
    monkeypatch.setattr(workflow_module, "_hook", None)
    pushed = [json.loads(x) for x in r.lrange("queue:default", 0, -1)]
    assert sum(p["class"] == second.name for p in pushed) == 3
    advance({}, wid, "one", "success")  # the rerun after recovery: same bid, jids, no push
    again = [json.loads(x) for x in r.lrange("queue:default", 0, -1)]
    assert sorted(p["jid"] for p in again) == sorted(p["jid"] for p in pushed)
    assert r.scard(f"b-{wid}.1-jids") == 3  # the three jobs, counted once
    launch()
    assert finished(wid).state == "succeeded"
    # Step one's own job still runs (its end was faked above): its callback is a replay.
    wait_for(lambda: r.exists(f"b-{wid}.0-success"), what="step one's batch succeeded")
    wait_for(lambda: r.exists(f"b-{wid}-success"), what="the root batch succeeded")
    assert r.get("first") == "1" and r.get("second") == "3"


def test_wurk_workflows_lists_and_shows(cli: Cli, config: Config, r: redis.Redis,
                                        define: Define, launch: Callable[..., Any]) -> None:
    def boom() -> None:
        raise ValueError("no such file")
    ok = define(lambda: 42)
    bad = define(boom, retry=False)
    wid = wurk.Workflow(wurk.step(ok, name="fine") >> wurk.step(bad, name="broken"),
                        description="the import").start()
    launch()
    finished(wid)
    listed = cli("workflows", "--json")
    assert listed.code == 0 and listed.json["workflows"] == [{"wid": wid, "state": "stopped"}]
    assert wid in cli("workflows").out
    shown = cli("workflows", "show", wid)
    assert shown.code == 0 and "broken" in shown.out and "no such file" in shown.out
    steps = cli("workflows", "show", wid, "--json").json["workflow"]["steps"]
    assert [s["state"] for s in steps] == ["succeeded", "failed"]
    assert cli("workflows", "show", "nope").code == 1
    assert cli("workflows", "show").code == 2


def test_garbage_in_redis_is_a_clear_error(config: Config, r: redis.Redis,
                                           define: Define) -> None:
    one = define(lambda: None)
    wid = wurk.Workflow(wurk.step(one, name="only")).start()
    for garbage in ("not json", '{"policy": "stop", "steps": {"a": {"job": 7}}}', "[1, 2]",
                    '{"policy": "stop", "steps": {"a": {"job": "x", "after": ["a"]}}}'):
        r.hset(f"b-{wid}", "workflow", garbage)
        with pytest.raises(wurk.WorkflowError, match="unusable"):
            wurk.Workflow.status(wid)
        with pytest.raises(wurk.WorkflowError, match="unusable"):
            advance({}, wid, "only", "success")
    r.delete(f"b-{wid}")
    with pytest.raises(wurk.WorkflowError, match="does not exist"):
        advance({}, wid, "only", "success")

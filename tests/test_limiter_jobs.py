"""A job that hits a limit, in a real worker: rescheduled without spending a retry, run
later, failed as any error past the cap; seen in metrics and in ``wurk limiters``."""

from __future__ import annotations

import dataclasses
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import admin_cli
import pytest
import redis
from waiting import wait_for

import wurk
from wurk.limiter import OverLimit
from wurk.observe import metrics
from wurk.push.job import JobFunction
from wurk.runtime import overlimit
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

Define = Callable[..., JobFunction[..., Any]]
keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def entries(r: redis.Redis, key: str) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(raw), score) for raw, score in r.zrange(key, 0, -1, withscores=True)]


def test_a_job_over_the_limit_is_rescheduled_keeps_its_retries_and_runs_later(
        config: Config, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    observed = dataclasses.replace(config, metrics_prometheus=True, health_listen="127.0.0.1:0")
    limiter = wurk.limiter.concurrent(f"one-{uuid.uuid4().hex[:6]}", 1, wait_timeout=0,
                                      backoff=lambda overrated: 0.3)
    ran = redis.Redis(port=r.connection_pool.connection_kwargs["port"])

    def charge(order: int) -> None:
        with limiter.acquire():
            ran.rpush("ran", order)

    job = define(charge)
    held = limiter.wait()
    wurk.Client().push({"class": job.name, "args": [7], "retry_count": 3})
    launch_with(observed)
    rescheduled = wait_for(lambda: entries(r, "schedule"), what="a reschedule")
    payload, _ = rescheduled[0]
    assert payload["overrated"] >= 1 and payload["retry_count"] == 3
    assert payload["queue"] == "default" and "error_class" not in payload
    assert r.zcard("retry") == 0 and int(r.get("stat:failed") or 0) == 0
    held.release()
    wait_for(lambda: r.lrange("ran", 0, -1) == ["7"], what="the job ran once the slot freed")
    assert r.zcard("retry") == r.zcard("dead") == r.zcard("schedule") == 0
    text = metrics.for_config(observed).totals.render()  # type: ignore[union-attr]
    tags = f'{{class="{job.name}",queue="default"}}'
    assert f"wurk_jobs_overlimit_total{tags} {payload['overrated']}" in text
    assert f"wurk_jobs_failed_total{tags} 0" in text


@pytest.mark.parametrize("cap", [0, 2])
def test_past_the_cap_the_limit_fails_the_job_as_any_error(
        config: Config, r: redis.Redis, define: Define, launch: Callable[..., Launcher],
        cap: int) -> None:
    limiter = wurk.limiter.window(f"w-{uuid.uuid4().hex[:6]}", 1, interval=3600,
                                  wait_timeout=0, reschedule=cap, backoff=lambda n: 0.05)
    limiter.wait()  # the window is full for the hour

    def call_api() -> None:
        with limiter.acquire():
            pass

    job = define(call_api)
    job.perform_async()
    launch()
    failed = wait_for(lambda: entries(r, "retry"), what="the job in the retry set")
    payload, _ = failed[0]
    assert payload["error_class"] == "OverLimit" and payload["retry_count"] == 0
    assert payload["overrated"] == cap + 1
    assert r.zcard("schedule") == 0
    wait_for(lambda: r.get("stat:failed") == "1", what="one failure counted")


def test_the_default_backoff_is_sidekiq_enterprises(config: Config, r: redis.Redis,
                                                    define: Define,
                                                    launch: Callable[..., Launcher]) -> None:
    limiter = wurk.limiter.bucket(f"b-{uuid.uuid4().hex[:6]}", 1, interval=3600,
                                  wait_timeout=0)
    limiter.wait()

    def send() -> None:
        with limiter.acquire():
            pass

    define(send).perform_async()
    before = time.time()
    launch()
    payload, at = wait_for(lambda: entries(r, "schedule"), what="a reschedule")[0]
    assert payload["overrated"] == 1
    assert before + 301 <= at <= time.time() + 600  # 300 * 1 + rand(300) + 1


def test_plan_reads_garbage_counts_and_survives_broken_backoffs(config: Config) -> None:
    def broken(overrated: int) -> float:
        raise RuntimeError("no")

    rng = random.Random(0)
    for backoff in (broken, lambda n: float("nan"), lambda n: -5, lambda n: "soon"):
        limiter = wurk.limiter.window("x", 1, backoff=backoff)  # type: ignore[arg-type]
        job: dict[str, Any] = {"class": "X", "args": [], "overrated": "lots"}
        settlement = overlimit.plan(config, job, "low", OverLimit(limiter), rng=rng, now=1000.0)
        assert settlement is not None and settlement.outcome == "schedule"
        assert 1301 <= settlement.at <= 1600
        assert json.loads(settlement.entry) == {**job, "overrated": 1, "queue": "low"}
    plain = {"class": "X", "args": []}
    assert overlimit.plan(config, plain, "q", RuntimeError("x"), rng=rng) is None
    assert plain == {"class": "X", "args": []}


def test_wurk_limiters_lists_them_as_json_and_resets_one(
        config: Config, r: redis.Redis, cli: admin_cli.Cli) -> None:
    stripe = wurk.limiter.concurrent("stripe", 5, lease=30)
    stripe.wait()
    wurk.limiter.leaky("sms", 10, interval=60).wait()
    r.sadd("lmtr-list", "broken")
    listed = cli("limiters", "--json")
    assert listed.code == 0, listed.err
    by_name = {entry["name"]: entry for entry in listed.json["limiters"]}
    assert by_name["stripe"] == {"name": "stripe", "kind": "concurrent", "limit": 5, "used": 1,
                                 "options": {"limit": 5, "lock_timeout": 30},
                                 "reclaimed": 0, "overages": 0, "error": None}
    assert by_name["sms"]["kind"] == "leaky" and by_name["sms"]["limit"] == 10
    assert "gone" in by_name["broken"]["error"]
    table = cli("limiters")
    assert table.code == 0
    assert admin_cli.columns(table.lines[0]) == ["NAME", "KIND", "LIMIT", "USED", "PER", "NOTES"]
    assert any(admin_cli.columns(line)[:4] == ["stripe", "concurrent", "5", "1"]
               for line in table.lines)
    reset = cli("limiters", "reset", "stripe", "--yes", "--json")
    assert reset.code == 0 and reset.json == {"name": "stripe", "reset": True, "keys_deleted": 1}
    assert r.zcard("lmtr-cs:stripe") == 0
    unknown = cli("limiters", "reset", "nope", "--yes")
    assert unknown.code == 1 and "no limiter named 'nope'" in unknown.err
    assert cli("limiters", "reset").code == 2

"""A job whose class this process does not know is kept, never discarded (issue 25, item 6).

A class missing here is a deployment's problem (a Python worker reading a
queue Ruby jobs use, a deploy that has not reached this host), not the job's
failure: whatever its ``retry`` and ``dead`` say, it retries with Sidekiq's
backoff within its budget and goes to dead only once that is spent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs
from tuning import tuned
from waiting import wait_for

from wurk.push.job import UnknownJobError
from wurk.runtime.launcher import Launcher
from wurk.runtime.retry import RetryHandler, unknown_class_budget
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

Launch = Callable[..., Launcher]
# Each one would be dropped or sent to dead at its first failure if its class were known.
FATAL_FIELDS = [{"retry": False}, {"retry": 0}, {"retry": 0, "dead": False},
                {"retry": False, "dead": False}, {"retry": True, "dead": False,
                                                  "retry_for": 0}]


def unknown_job(**fields: Any) -> dict[str, Any]:
    return {"class": "Billing::ChargeCard", "args": [1], "jid": new_jid(), "queue": "default",
            "created_at": time.time(), **fields}


def unknown(job: dict[str, Any]) -> UnknownJobError:
    return UnknownJobError.for_name(job["class"])


@pytest.fixture
def handler(config: Config) -> RetryHandler:
    retry = RetryHandler(config, rng=random.Random(7))
    retry.identity = "web-3:1234:abcdef"
    return retry


@pytest.mark.parametrize("fields", FATAL_FIELDS)
def test_an_unknown_class_retries_whatever_retry_and_dead_say(
        handler: RetryHandler, fields: dict[str, Any]) -> None:
    job = unknown_job(**fields)
    before = time.time()
    settlement = handler.plan(job, "default", unknown(job), None)
    after = time.time()
    assert settlement.outcome == "retry"
    entry = json.loads(settlement.entry)
    assert (entry["retry_count"], entry["error_class"]) == (0, "UnknownJobError")
    assert "web-3:1234:abcdef" in entry["error_message"]
    # Sidekiq's first backoff: 15 s plus up to 9 s of jitter.
    assert before + 15 <= settlement.at <= after + 25


@pytest.mark.parametrize(("retry", "budget"), [
    (3, 3), (1, 1), (True, 25), (False, 25), (0, 25), (None, 25), (-4, 25), ("5", 25),
    (2.0, 25)])
def test_the_budget_is_the_jobs_own_positive_count_else_the_default(
        retry: Any, budget: int) -> None:
    assert unknown_class_budget(retry, 25) == budget


@pytest.mark.parametrize("fields", [{"retry": 3}, {"retry": 3, "dead": False}])
def test_an_unknown_class_goes_to_dead_only_when_its_budget_is_spent(
        handler: RetryHandler, fields: dict[str, Any]) -> None:
    job = unknown_job(**fields)
    outcomes = []
    for _ in range(4):
        settlement = handler.plan(job, "default", unknown(job), None)
        outcomes.append(settlement.outcome)
        job = json.loads(settlement.entry)
    assert outcomes == ["retry", "retry", "retry", "dead"]
    assert job["retry_count"] == 3


def test_the_default_budget_is_max_retries(config: Config) -> None:
    handler = RetryHandler(tuned(config, max_retries=1), rng=random.Random(7))
    job = unknown_job(retry=False)
    first = handler.plan(job, "default", unknown(job), None)
    job = json.loads(first.entry)
    assert (first.outcome, handler.plan(job, "default", unknown(job), None).outcome) == (
        "retry", "dead")


def test_each_time_says_which_process_lacked_the_class(handler: RetryHandler) -> None:
    job = unknown_job(retry=0)
    with capture_logs() as logs:
        handler.plan(job, "default", unknown(job), None)
    [line] = [e for e in logs if e["event"] == "job.unknown_class"]
    assert (line["identity"], line["hostname"], line["pid"]) == (
        "web-3:1234:abcdef", socket.gethostname(), os.getpid())
    assert (line["jid"], line["job_class"], line["budget"]) == (job["jid"], job["class"], 25)


def push_fatal(r: redis.Redis) -> list[str]:
    jids = []
    for fields in FATAL_FIELDS:
        job = unknown_job(**fields)
        jids.append(job["jid"])
        r.lpush("queue:default", json.dumps(job))
    r.sadd("queues", "default")
    return jids


@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_worker_keeps_every_job_of_a_class_it_lacks(
        config: Config, launch_with: Launch, r: redis.Redis, executor: str) -> None:
    jids = push_fatal(r)
    with capture_logs() as logs:
        launcher = launch_with(dataclasses.replace(config, executor=executor))
        wait_for(lambda: r.zcard("retry") == len(jids), timeout=20,
                 what="every unknown-class job in the retry set")
    assert r.zcard("dead") == 0 and r.llen("queue:default") == 0
    kept = [json.loads(m) for m in r.zrange("retry", 0, -1)]
    assert sorted(j["jid"] for j in kept) == sorted(jids)
    assert all(j["retry_count"] == 0 and j["error_class"] == "UnknownJobError" for j in kept)
    lines = [e for e in logs if e["event"] == "job.unknown_class"]
    assert {e["jid"] for e in lines} == set(jids)
    assert {e["identity"] for e in lines} == {launcher.identity}

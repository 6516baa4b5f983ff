"""Ruby → Python: jobs pushed by Ruby Sidekiq's client run on wurk, and
retry/dead entries wurk wrote are retried and killed by Ruby Sidekiq's API.

Ruby runs for real (tests/interop/push.rb and api.rb, Sidekiq 6.4.1); the
Python side is an in-process wurk Launcher with jobs registered under the
wire names Ruby pushes (PyEcho, PyFlaky).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis
from conftest import RedisServer
from test_interop_support import (
    ARGS,
    PY_RUNS,
    assert_exact,
    launched,
    list_items,
    private_redis,
    python_jobs,
    require_ruby,
    ruby_types,
    run_ruby,
    wait_run,
    zset_items,
)
from waiting import wait_for

import wurk
from wurk.api import DeadSet, RetrySet
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server (see private_redis)."""
    with private_redis() as server:
        yield server


@pytest.fixture
def worker(config: Config, r: redis.Redis) -> Iterator[Launcher]:
    """A running wurk launcher that knows PyEcho, PySlow, PyFlaky and PyFail."""
    require_ruby()
    with python_jobs(config), launched(config) as launcher:
        yield launcher


@pytest.mark.parametrize("how", ["client_push", "perform_async", "push_bulk"])
def test_ruby_pushed_jobs_run_on_wurk_with_exact_args(worker: Launcher, config: Config,
                                                     r: redis.Redis, how: str) -> None:
    pushed = run_ruby(config.redis_url, "push.rb", how)
    expected = pushed.get("args", [ARGS])
    assert len(pushed["jids"]) == len(expected)
    created = set()
    for jid, args in zip(pushed["jids"], expected, strict=True):
        [run] = wait_run(r, PY_RUNS, jid)
        assert run["class"] == "PyEcho"
        assert_exact(run["args"], args)
        assert run["types"] == ruby_types(args)  # what perform() got, as Ruby classes
        job = run["job"]
        # Ruby's payload reached the job whole: its own jid and Ruby's defaults.
        assert (job["jid"], job["queue"], job["retry"]) == (jid, "default", True)
        assert isinstance(job["created_at"], float) and isinstance(job["enqueued_at"], float)
        created.add(job["created_at"])
    assert len(created) == 1  # push_bulk stamps one created_at for all its jobs
    wurk_args = [json.loads(raw)["args"] for raw in list_items(r, PY_RUNS)]
    assert len(wurk_args) == len(expected)  # each ran once


def test_ruby_perform_in_runs_on_wurk_when_due(worker: Launcher, config: Config,
                                               r: redis.Redis) -> None:
    delay = 1.5
    pushed = run_ruby(config.redis_url, "push.rb", "perform_in", str(delay))
    [jid] = pushed["jids"]
    [(member, score)] = zset_items(r, "schedule")
    scheduled = json.loads(member)
    assert scheduled["jid"] == jid and "at" not in scheduled and "enqueued_at" not in scheduled
    assert score == pytest.approx(pushed["at"], abs=0.01)
    [run] = wait_run(r, PY_RUNS, jid, timeout=delay + 5)
    assert run["ran_at"] >= pushed["at"] - 0.05  # not before it was due
    assert_exact(run["args"], ARGS)
    assert run["job"]["enqueued_at"] >= pushed["at"] - 0.05  # stamped when wurk enqueued it
    assert r.zcard("schedule") == 0


def wurk_retry_entry(config: Config, r: redis.Redis) -> str:
    """Push PyFlaky from Python; its first run fails and wurk writes a retry entry."""
    jid = wurk.Client(config).push({"class": "PyFlaky", "args": ARGS})
    wait_for(lambda: r.zcard("retry") == 1, what="wurk's retry entry")
    entry = RetrySet(config=config).find_job(jid, must_exist=True)
    assert entry is not None and entry.at > time.time() + 10  # not due during the test
    return jid


def test_ruby_retry_set_retry_runs_a_wurk_entry_on_wurk(worker: Launcher, config: Config,
                                                       r: redis.Redis) -> None:
    jid = wurk_retry_entry(config, r)
    assert run_ruby(config.redis_url, "api.rb", "retry", "retry") == {"jids": [jid]}
    [run] = wait_run(r, PY_RUNS, jid)
    assert run["attempt"] == 2
    assert_exact(run["args"], ARGS)
    job = run["job"]
    # Ruby's SortedEntry#retry decremented wurk's retry_count (0 → -1) and kept
    # the failure fields wurk wrote.
    assert (job["retry_count"], job["error_class"]) == (-1, "PyFailure")
    assert r.zcard("retry") == 0


def test_ruby_kills_a_wurk_entry_and_retries_it_from_the_morgue(worker: Launcher,
                                                                config: Config,
                                                                r: redis.Redis) -> None:
    jid = wurk_retry_entry(config, r)
    assert run_ruby(config.redis_url, "api.rb", "kill", "retry") == {"jids": [jid]}
    assert r.zcard("retry") == 0
    # Readable by both sides with the failure fields wurk wrote.
    dead = DeadSet(config=config).find_job(jid, must_exist=True)
    assert dead is not None
    assert (dead.error_class, dead.retry_count, dead.args) == ("PyFailure", 0, ARGS)
    assert dead.at == pytest.approx(time.time(), abs=5)
    [ruby_dead] = run_ruby(config.redis_url, "api.rb", "dump")["dead"]
    assert (ruby_dead["jid"], ruby_dead["error_class"]) == (jid, "PyFailure")
    assert ruby_dead["error_message"] == "flaky failure on attempt 1"
    assert_exact(ruby_dead["args"], ARGS)

    assert run_ruby(config.redis_url, "api.rb", "retry", "dead") == {"jids": [jid]}
    [run] = wait_run(r, PY_RUNS, jid)
    assert run["attempt"] == 2 and r.zcard("dead") == 0
    assert_exact(run["args"], ARGS)

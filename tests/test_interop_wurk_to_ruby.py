"""Python → Ruby: jobs pushed by wurk run on a real Ruby Sidekiq 6.4 server,
and retry/dead entries Ruby wrote are retried and killed through wurk.api.

One ``sidekiq -r tests/interop/worker.rb -q default -c 2`` serves the whole
module (its jobs record what they got in ``interop:ruby-runs``); each test
finds its own jobs by jid.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import test_interop_support
from test_interop_support import (
    ARGS,
    RUBY_RUNS,
    RubySidekiq,
    assert_exact,
    list_items,
    ruby_types,
    run_ruby,
    wait_run,
    zset_items,
)
from waiting import wait_for

import wurk
from wurk.api import DeadSet, RetrySet, SortedEntry
from wurk.push.job import registry
from wurk.settings.config import Config

# This module's own redis-server and Ruby Sidekiq (see private_redis).
redis_server = test_interop_support.module_redis_server
ruby = test_interop_support.module_ruby


def test_wurk_pushed_jobs_run_on_ruby_with_exact_args(ruby: RubySidekiq, config: Config,
                                                      r: redis.Redis) -> None:
    client = wurk.Client(config)
    stub = wurk.job(name="RbEcho")(lambda *args: None)  # a Python name for the Ruby class
    try:
        bulk = [ARGS, ARGS[::-1], ["bulk", 3]]
        pushed = [(client.push({"class": "RbEcho", "args": ARGS}), ARGS),
                  (stub.perform_async(*ARGS), ARGS),
                  *zip(client.push_bulk({"class": "RbEcho", "args": bulk}), bulk, strict=True)]
    finally:
        registry.discard("RbEcho")
    for jid, args in pushed:
        [run] = wait_run(r, RUBY_RUNS, jid)
        assert run["class"] == "RbEcho" and run["pid"] == ruby.pid
        assert_exact(run["args"], args)
        assert run["types"] == ruby_types(args)  # Ruby's own classes for what perform got
        job = run["job"]
        assert (job["jid"], job["queue"], job["retry"]) == (jid, "default", True)
        assert isinstance(job["created_at"], float) and isinstance(job["enqueued_at"], float)
        assert job["enqueued_at"] == pytest.approx(time.time(), abs=10)
    assert len(list_items(r, RUBY_RUNS)) == len(pushed)


def test_wurk_perform_in_runs_on_ruby_when_due(ruby: RubySidekiq, config: Config,
                                               r: redis.Redis) -> None:
    delay = 1.5
    stub = wurk.job(name="RbEcho")(lambda *args: None)
    try:
        before = time.time()
        jid = stub.set(client=wurk.Client(config)).perform_in(delay, *ARGS)
    finally:
        registry.discard("RbEcho")
    [(_, score)] = zset_items(r, "schedule")
    assert before + delay <= score <= time.time() + delay
    [run] = wait_run(r, RUBY_RUNS, jid, timeout=delay + 8)  # Ruby's poller moved it
    assert run["ran_at"] >= score - 0.05
    assert_exact(run["args"], ARGS)
    assert run["job"]["enqueued_at"] >= score - 0.05 and "at" not in run["job"]
    assert r.zcard("schedule") == 0


def ruby_retry_entry(config: Config, r: redis.Redis) -> SortedEntry:
    """RbFlaky pushed by wurk fails once on Ruby, which writes a retry entry."""
    jid = wurk.Client(config).push({"class": "RbFlaky", "args": ARGS, "backtrace": True})
    wait_for(lambda: r.zcard("retry") == 1, what="Ruby's retry entry")
    entry = RetrySet(config=config).find_job(jid, must_exist=True)
    assert entry is not None
    return entry


def check_ruby_failure(entry: Any, jid: str) -> None:
    """The failure fields Ruby wrote, as wurk.api reads them."""
    assert (entry.jid, entry.klass, entry.queue) == (jid, "RbFlaky", "default")
    assert (entry.error_class, entry.error_message) == ("RuntimeError",
                                                        "flaky failure on attempt 1")
    assert entry.retry_count == 0 and entry.retried_at is None
    assert entry.failed_at == pytest.approx(time.time(), abs=10)
    backtrace = entry.error_backtrace
    assert backtrace and "worker.rb" in backtrace[0] and "perform" in backtrace[0]
    assert entry.args == ARGS


def test_wurk_api_retries_a_ruby_retry_entry_on_ruby(ruby: RubySidekiq, config: Config,
                                                     r: redis.Redis) -> None:
    entry = ruby_retry_entry(config, r)
    jid = str(entry.jid)
    check_ruby_failure(entry, jid)
    assert entry.at > time.time() + 10  # Ruby's backoff: not due during the test
    assert entry.retry() is True
    [run] = wait_run(r, RUBY_RUNS, jid)
    assert run["attempt"] == 2
    assert_exact(run["args"], ARGS)
    # wurk's retry decremented Ruby's retry_count (0 → -1), as Sidekiq's does.
    assert (run["job"]["retry_count"], run["job"]["error_class"]) == (-1, "RuntimeError")
    assert r.zcard("retry") == 0


def test_wurk_api_kills_a_ruby_entry_and_retries_it_from_the_morgue(
        ruby: RubySidekiq, config: Config, r: redis.Redis) -> None:
    entry = ruby_retry_entry(config, r)
    jid = str(entry.jid)
    assert entry.kill() is True
    assert r.zcard("retry") == 0
    [ruby_dead] = run_ruby(config.redis_url, "api.rb", "dump")["dead"]
    assert (ruby_dead["jid"], ruby_dead["error_class"]) == (jid, "RuntimeError")
    assert ruby_dead["at"] == pytest.approx(time.time(), abs=10)
    assert_exact(ruby_dead["args"], ARGS)
    dead = DeadSet(config=config).find_job(jid, must_exist=True)
    assert dead is not None
    check_ruby_failure(dead, jid)

    assert dead.retry() is True
    [run] = wait_run(r, RUBY_RUNS, jid)
    assert run["attempt"] == 2 and r.zcard("dead") == 0
    assert_exact(run["args"], ARGS)

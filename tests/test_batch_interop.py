"""Batch jobs on a real Ruby Sidekiq 6.4 (OSS) server: it runs a job pushed by
``wurk.Batch`` and keeps the payload's ``bid`` (in the job it runs and in
the retry entry it writes), but OSS Sidekiq has no batch middleware, so it
never updates the batch: pending stays where the push left it and no
callback fires. The docs say so (docs/how-to/batches.md#ruby)."""

from __future__ import annotations

import json

import redis
import test_interop_support
from test_interop_support import RUBY_RUNS, RubySidekiq, wait_run
from waiting import wait_for

import wurk
from wurk.api import BatchStatus
from wurk.settings.config import Config

# This module's own redis-server and Ruby Sidekiq (see private_redis).
redis_server = test_interop_support.module_redis_server
ruby = test_interop_support.module_ruby


def test_ruby_runs_a_batch_job_keeps_its_bid_and_leaves_the_counters(
        ruby: RubySidekiq, config: Config, r: redis.Redis) -> None:
    echo = wurk.job(name="RbEcho")(lambda *args: None)  # Python names for the Ruby classes
    flaky = wurk.job(name="RbFlaky")(lambda *args: None)
    try:
        with wurk.Batch("on ruby", on_success=echo) as b:
            jid = b.add(echo, "hi")
            flaky_jid = b.add(flaky, "again")
        [run] = wait_run(r, RUBY_RUNS, str(jid))
        assert run["job"]["bid"] == b.bid and run["args"] == ["hi"]
        wait_for(lambda: r.zcard("retry") == 1, what="Ruby's retry entry")
        [entry] = [json.loads(raw) for raw in r.zrange("retry", 0, -1)]
        assert (entry["jid"], entry["bid"]) == (flaky_jid, b.bid)
        status = BatchStatus.read(b.bid)
        assert (status.pending, status.failures, status.state) == (2, 0, "running")
        assert not r.exists(f"b-{b.bid}-success")
    finally:
        wurk.registry.discard("RbEcho")
        wurk.registry.discard("RbFlaky")

"""Job results on a Redis shared with Ruby Sidekiq 6.4: Ruby keeps the
``result_ttl`` field through a run and a retry, and a wurk worker that then
runs the retried job stores its result."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis
import test_interop_support
from test_interop_support import RUBY_RUNS, RubySidekiq, wait_run
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

# This module's own redis-server and Ruby Sidekiq (see private_redis).
redis_server = test_interop_support.module_redis_server
ruby = test_interop_support.module_ruby


def test_ruby_keeps_result_ttl_and_a_wurk_worker_stores_the_retried_jobs_result(
        ruby: RubySidekiq, config: Config, r: redis.Redis,
        launch_with: Callable[..., Launcher]) -> None:
    client = wurk.Client(config)
    echo = client.push({"class": "RbEcho", "args": [1], "result_ttl": 60})
    assert echo is not None
    [run] = wait_run(r, RUBY_RUNS, echo)
    assert run["job"]["result_ttl"] == 60  # Ruby ran it and saw the field
    assert not r.exists(f"wurk:result:{echo}")  # a Ruby worker stores nothing

    flaky = client.push({"class": "RbFlaky", "args": [2], "result_ttl": 60})
    wait_for(lambda: r.zcard("retry") == 1, what="Ruby's retry entry")
    (entry,) = r.zrange("retry", 0, 0)
    r.zrem("retry", entry)
    payload = json.loads(entry)
    assert payload["result_ttl"] == 60 and payload["error_class"] == "RuntimeError"
    # A wurk worker on a queue Ruby does not serve runs the retry.
    payload["queue"] = "wurk-only"
    r.lpush("queue:wurk-only", json.dumps(payload))
    wurk.job(name="RbFlaky")(lambda n: f"python ran {n}")
    try:
        config = tuned(config, queues=["wurk-only"])
        launch_with(config)
        assert wurk.result(flaky, timeout=15) == "python ran 2"
    finally:
        wurk.registry.discard("RbFlaky")

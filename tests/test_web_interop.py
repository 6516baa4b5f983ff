"""The dashboard on a Redis shared with a live Ruby Sidekiq 6.4.

A real ``sidekiq`` process (tests/interop/worker.rb) runs a slow job and
fails a flaky one into the retry set, in its own format; the dashboard
shows both, its Retry now runs the job again in Ruby, and its Quiet and
Stop buttons reach the Ruby process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from conftest import RedisServer
from starlette.testclient import TestClient
from test_interop_support import RUBY_RUNS, private_redis, ruby_sidekiq, wait_run
from waiting import wait_for

import wurk
import wurk.web
from wurk.api import ProcessSet
from wurk.settings.config import Config


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server (see private_redis)."""
    with private_redis() as server:
        yield server


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


def test_the_dashboard_shows_and_steers_ruby_sidekiq(config: Config, r: redis.Redis) -> None:
    client = wurk.Client(config)
    with ruby_sidekiq(config.redis_url, r, "-q", "default", "-g", "rb-web") as ruby, \
            TestClient(wurk.web.app(config)) as web:
        flaky = client.push({"class": "RbFlaky", "args": [1, "<b>bold</b>"]})
        slow = client.push({"class": "RbSlow", "args": [9, "<script>x()</script>"]})
        wait_run(r, RUBY_RUNS, slow)
        wait_for(lambda: [p.busy for p in ProcessSet(config=config)] == [1],
                 what="Ruby's busy beat")
        busy = web.get("/busy").text
        assert ruby.identity in busy and "rb-web" in busy and "RbSlow" in busy
        assert "&lt;script&gt;x()&lt;/script&gt;" in busy and "<script>x()" not in busy

        wait_for(lambda: r.zcard("retry") == 1, what="Ruby's retry entry")
        retries = web.get("/retries").text
        assert "RbFlaky" in retries and "flaky failure on attempt 1" in retries
        key = re.search(r'name="key" value="([^"]+)"', retries).group(1)  # type: ignore[union-attr]
        entry = web.get(f"/retries/{key}").text
        assert "error_message" in entry and "&lt;b&gt;bold&lt;/b&gt;" in entry
        web.post(f"/retries/{key}", data={"csrf": csrf(entry), "action": "retry"})
        assert r.zcard("retry") == 0
        wait_run(r, RUBY_RUNS, flaky)  # Ruby ran it again, from the dashboard's push

        token = csrf(busy)
        web.post("/busy/quiet", data={"csrf": token, "identity": ruby.identity})
        wait_for(lambda: (p := ProcessSet(config=config).get(ruby.identity)) is not None
                 and p.is_quiet, what="Ruby quiet")
        assert "quiet" in web.get("/busy").text
        web.post("/busy/stop", data={"csrf": token, "identity": ruby.identity})
        assert ruby.proc.wait(20) == 0

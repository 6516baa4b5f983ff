"""wurk.api over RESP2, the reply shapes redis-py before 8.0 uses by default.

RESP3 (redis-py 8's default, and the rest of these tests) sends scores as
doubles, WITHSCORES as pairs and HGETALL as a map; RESP2 sends flat lists of
strings. Every reader must take both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis
from conftest import RedisServer
from test_api_support import RUBY_IDENTITY, RUBY_INFO, RUBY_JOB, ruby_heartbeat

import wurk
from wurk.api import ProcessSet, RetrySet, ScheduledSet, Stats, Workers
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.settings.config import Config


@pytest.fixture
def resp2(redis_server: RedisServer, r: redis.Redis) -> Iterator[Config]:
    cfg = Config(redis_url=f"{redis_server.url}?protocol=2", log_level="warning")
    assert runtime_for(cfg).pool.call("HGETALL", "nothing") == []  # a map would be {} in RESP3
    yield cfg
    close_runtime(cfg)


def test_sorted_set_reads_and_moves(resp2: Config, r: redis.Redis) -> None:
    jids = [wurk.Client(resp2).push({"class": "X", "args": [i], "at": time.time() + 100 + i})
            for i in range(60)]
    scheduled = ScheduledSet(config=resp2)
    assert [e.jid for e in scheduled] == jids
    entry = scheduled.find_job(jids[42], must_exist=True)
    assert entry is not None and entry.args == [42]
    assert entry.reschedule(time.time() + 9000.5)
    assert entry.at == r.zscore("schedule", entry.value)
    assert [e.args for e in scheduled.scan('[42]')] == [[42]]
    r.zadd("retry", {RUBY_JOB.replace('"retry":true', '"retry_count":3'): 5.0})
    assert RetrySet(config=resp2).retry_all() == 1
    assert json.loads(r.lrange("queue:default", 0, 0)[0])["retry_count"] == 2


def test_processes_workers_and_stats(resp2: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=1)
    r.hset(f"{RUBY_IDENTITY}:workers", "69x",
           json.dumps({"queue": "default", "payload": RUBY_JOB, "run_at": 1796022187}))
    [process] = ProcessSet(config=resp2)
    assert (process.identity, process.concurrency, process.busy) == (RUBY_IDENTITY, 3, 1)
    [(identity, thread, work)] = Workers(config=resp2)
    assert (identity, thread, work.payload["class"]) == (RUBY_IDENTITY, "69x", "WurkEcho")
    stats = Stats(config=resp2)
    assert (stats.processes_size, stats.workers_size) == (1, 1)

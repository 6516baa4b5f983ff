"""Reliable push: pushes made during a Redis outage arrive, once and in order."""

from __future__ import annotations

import json
import os

import pytest
import redis

import wurk
from tests.conftest import RedisServer, start_redis
from tests.faultproxy import FaultProxy
from tests.waiting import wait_for
from wurk.push.buffered import PushBufferFullError
from wurk.push.client import Client
from wurk.settings.config import Config

# These tests push to a Redis that never answered on purpose (its buffering is
# what they test); tests/test_push_nowhere.py covers the warning that says so.
pytestmark = pytest.mark.filterwarnings("ignore::wurk.PushSpooledWarning")


def make_client(url: str, **settings: object) -> Client:
    config = Config(redis_url=url, redis_retry_attempts=1, redis_connect_timeout=0.2,
                    log_level="warning", **settings)  # type: ignore[arg-type]
    return Client(config)


def queued_jids(server: RedisServer, queue: str = "default") -> list[str]:
    with server.client() as c:
        return [json.loads(raw)["jid"] for raw in reversed(c.lrange(f"queue:{queue}", 0, -1))]


def test_pushes_during_an_outage_arrive_in_order_when_redis_returns(
        own_redis: RedisServer) -> None:
    client = make_client(own_redis.url)
    client.push({"class": "Echo", "args": [0]})  # a pooled connection that will go stale
    own_redis.stop()
    during = [client.push({"class": "Echo", "args": [i]}) for i in range(1, 51)]
    during += client.push_bulk({"class": "Echo", "args": [[i] for i in range(51, 61)]})
    assert client.buffer is not None
    assert len(client.buffer) == 60
    restarted = start_redis(port=own_redis.port)
    try:
        assert client.buffer.flush(10)
        # The restarted server kept nothing (no persistence): exactly the
        # buffered pushes arrived, oldest first.
        assert queued_jids(restarted) == during
    finally:
        restarted.stop()


def test_a_full_buffer_refuses_the_push_and_keeps_the_rest(own_redis: RedisServer) -> None:
    client = make_client(own_redis.url, push_buffer_size=3)
    own_redis.stop()
    kept = [client.push({"class": "Echo", "args": [i]}) for i in range(3)]
    with pytest.raises(PushBufferFullError, match="push_buffer_size=3"):
        client.push({"class": "Echo", "args": [99]})
    restarted = start_redis(port=own_redis.port)
    try:
        assert client.buffer is not None and client.buffer.flush(10)
        assert queued_jids(restarted) == kept
    finally:
        restarted.stop()


def test_a_push_that_may_have_landed_is_not_buffered_or_replayed(
        redis_server: RedisServer, r: redis.Redis) -> None:
    proxy = FaultProxy(redis_server.port)
    try:
        client = make_client(proxy.url)
        client.push({"class": "Echo", "args": ["warm"]})
        proxy.drop_next_reply()
        with pytest.raises(wurk.PushOutcomeUnknown) as unknown:
            client.push({"class": "Echo", "args": ["maybe"]})
        assert client.buffer is not None and len(client.buffer) == 0

        def landed() -> list[str]:
            return sorted(json.loads(raw)["args"][0] for raw in r.lrange("queue:default", 0, -1))

        wait_for(lambda: "maybe" in landed(), 10, what="the push whose reply was lost landed")
        assert landed() == ["maybe", "warm"]  # it landed once, and only once
        unknown.value.retry()  # a retry by its jid adds no second copy
        args = [json.loads(raw)["args"][0] for raw in r.lrange("queue:default", 0, -1)]
        assert sorted(args) == ["maybe", "warm"]
    finally:
        proxy.close()


def test_unbuffered_client_raises_at_once(own_redis: RedisServer) -> None:
    client = make_client(own_redis.url, reliable_push=False)
    own_redis.stop()
    with pytest.raises(redis.ConnectionError):
        client.push({"class": "Echo", "args": [1]})
    assert client.buffer is None


def test_a_forked_child_starts_with_an_empty_buffer(own_redis: RedisServer) -> None:
    client = make_client(own_redis.url)
    own_redis.stop()
    client.push({"class": "Echo", "args": [1]})
    assert client.buffer is not None and len(client.buffer) == 1
    pid = os.fork()
    if pid == 0:
        os._exit(0 if len(client.buffer) == 0 and client.buffer._drainer is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(client.buffer) == 1  # the parent still owns and will send it
    restarted = start_redis(port=own_redis.port)
    try:
        assert client.buffer.flush(10)
        assert len(queued_jids(restarted)) == 1
    finally:
        restarted.stop()


def test_the_drainer_outlives_a_base_exception(own_redis: RedisServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    client = make_client(own_redis.url)
    own_redis.stop()
    during = [client.push({"class": "Echo", "args": [i]}) for i in range(3)]
    assert client.buffer is not None and len(client.buffer) == 3
    pipeline = client.pool.pipeline
    calls: list[int] = []

    def exits_once(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit("out of a library")
        return pipeline(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(client.pool, "pipeline", exits_once)
    restarted = start_redis(port=own_redis.port)
    try:
        # The push whose send raised may have landed, so it is reported and
        # dropped; the drainer goes on with the rest without a new push.
        assert client.buffer.flush(10)
        assert queued_jids(restarted)[-2:] == during[1:]
    finally:
        restarted.stop()

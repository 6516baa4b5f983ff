"""Replica-confirmed pushes (``push_replicas``): a push counts once replicas
hold it, and sending it again never enqueues it twice.

Real servers on loopback: a primary and a replica, which the tests detach
(``REPLICAOF NO ONE``, as a promotion does) and reattach.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from conftest import RedisServer, start_redis
from faultproxy import FaultProxy
from waiting import wait_for

from wurk import keys
from wurk.client import Client
from wurk.config import Config, ConfigError
from wurk.confirmed import PushNotConfirmedError

# Without this a fresh replica waits five seconds before its first sync.
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


@dataclass
class Pair:
    primary: RedisServer
    replica: RedisServer

    def attach(self) -> None:
        with self.replica.client() as c:
            c.replicaof("127.0.0.1", self.primary.port)
        self.wait_in_sync()

    def detach(self) -> None:
        """The replica stops following (and acknowledging): a promotion, seen from the primary."""
        with self.replica.client() as c:
            c.replicaof("NO", "ONE")
        with self.primary.client() as c:
            wait_for(lambda: c.info("replication")["connected_slaves"] == 0)

    def wait_in_sync(self) -> None:
        with self.replica.client() as rc, self.primary.client() as pc:
            wait_for(lambda: rc.info("replication").get("master_link_status") == "up", timeout=10)
            # A replica fresh from a sync may take a moment to answer its
            # first acknowledgement request: wait for one that is answered.
            pc.set("wurk-test:probe", 1)
            wait_for(lambda: pc.execute_command("WAIT", 1, 500) == 1, timeout=10)


@pytest.fixture
def pair() -> Iterator[Pair]:
    primary = start_redis(*FAST_SYNC)
    replica = start_redis(*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port))
    found = Pair(primary, replica)
    try:
        found.wait_in_sync()
        yield found
    finally:
        for server in (primary, replica):
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)


def make_client(url: str, **settings: Any) -> Client:
    """A confirming client; tests that expect no confirmation shorten the wait."""
    settings.setdefault("push_replicas_timeout", 2.0)
    config = Config(redis_url=url, push_replicas=1, redis_retry_attempts=2,
                    redis_retry_base=0.01, log_level="warning", **settings)
    return Client(config)


UNCONFIRMED = {"push_replicas_timeout": 0.2}


def queued(server: RedisServer, queue: str = "default") -> list[Any]:
    """First arguments of the queued jobs, oldest first."""
    with server.client() as c:
        return [json.loads(raw)["args"][0] for raw in reversed(c.lrange(f"queue:{queue}", 0, -1))]


def markers(server: RedisServer) -> list[str]:
    with server.client() as c:
        return sorted(c.scan_iter(match=f"{keys.PUSHED_PREFIX}*"))


def test_a_confirmed_push_is_on_the_replica_when_push_returns(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False)
    at = time.time() + 3600
    client.push({"class": "Echo", "args": [1]})
    client.push_bulk({"class": "Echo", "args": [[2], [3]], "queue": "bulk"})
    scheduled = client.push({"class": "Echo", "args": [4], "at": at})
    # No waiting here: WAIT already did it.
    assert queued(pair.replica) == [1]
    assert queued(pair.replica, "bulk") == [2, 3]
    with pair.replica.client() as c:
        assert c.smembers("queues") == {"default", "bulk"}
        [(member, score)] = c.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(member)["jid"] == scheduled and score == pytest.approx(at)
    assert "enqueued_at" not in json.loads(member)


def test_markers_of_confirmed_pushes_are_retired(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False)
    for i in range(50):
        client.push({"class": "Echo", "args": [i]})
    # Each write deletes the markers of the pushes confirmed before it; only
    # the last one's waits (for the next push, or its TTL).
    [last] = markers(pair.primary)
    with pair.primary.client() as c:
        assert 0 < c.ttl(last) <= keys.PUSHED_TTL
    assert len(queued(pair.primary)) == 50


def test_an_unconfirmed_push_raises_and_sending_it_again_never_doubles_it(pair: Pair) -> None:
    hasty = make_client(pair.primary.url, reliable_push=False, **UNCONFIRMED)
    client = make_client(pair.primary.url, reliable_push=False)
    pair.detach()
    item = {"class": "Echo", "args": ["once"], "jid": "a" * 24}
    with pytest.raises(PushNotConfirmedError, match=r"only 0 of 1 replicas") as caught:
        hasty.push(item)
    assert caught.value.jids == ("a" * 24,)
    with pytest.raises(PushNotConfirmedError):
        hasty.push(item)  # still no replica: refused again, and still one copy
    assert queued(pair.primary) == ["once"]
    pair.attach()
    assert client.push(item) == "a" * 24
    assert queued(pair.primary) == ["once"]
    assert queued(pair.replica) == ["once"]


def test_a_push_the_primary_took_after_the_replica_was_promoted_is_never_reported_done(
        pair: Pair) -> None:
    """The failover window: the old primary still takes writes that the new
    one will never have. The push must not count as done."""
    old, new = pair.primary, pair.replica
    make_client(old.url, reliable_push=False).push({"class": "Echo", "args": ["before"]})
    pair.detach()  # the replica is now a primary of its own
    item = {"class": "Echo", "args": ["in the window"], "jid": "b" * 24}
    with pytest.raises(PushNotConfirmedError):
        make_client(old.url, reliable_push=False, **UNCONFIRMED).push(item)
    assert queued(old) == ["before", "in the window"]
    assert queued(new) == ["before"]
    # Sent again to the new primary (by the caller, or by the push buffer
    # once the pool follows the failover), it lands there exactly once; it
    # stays unconfirmed while the new primary has no replica.
    follower = make_client(new.url, reliable_push=False, **UNCONFIRMED)
    for _ in range(2):
        with pytest.raises(PushNotConfirmedError):
            follower.push(item)
    assert queued(new) == ["before", "in the window"]


def test_buffered_unconfirmed_pushes_are_sent_again_in_order_once_replicas_return(
        pair: Pair) -> None:
    client = make_client(pair.primary.url, **UNCONFIRMED)
    assert client.buffer is not None
    pair.detach()
    jids = [client.push({"class": "Echo", "args": [i]}) for i in range(5)]
    # The first went to the primary unconfirmed; the rest wait behind it.
    assert len(client.buffer) == 5
    assert queued(pair.primary) == [0]
    pair.attach()
    assert client.buffer.flush(10)
    assert queued(pair.primary) == [0, 1, 2, 3, 4]
    assert queued(pair.replica) == [0, 1, 2, 3, 4]
    with pair.replica.client() as c:
        assert [json.loads(raw)["jid"] for raw in reversed(c.lrange("queue:default", 0, -1))] \
            == jids


def test_a_lost_reply_is_replayed_without_a_second_copy(pair: Pair) -> None:
    proxy = FaultProxy(pair.primary.port)
    try:
        client = make_client(proxy.url, reliable_push=False)
        client.push({"class": "Echo", "args": ["warm"]})
        # The script applies, its reply never arrives; the pool replays the
        # whole write-and-wait, which the marker turns into a no-op.
        proxy.drop_next_reply()
        client.push({"class": "Echo", "args": ["replayed"]})
        assert queued(pair.primary) == ["warm", "replayed"]
        assert queued(pair.replica) == ["warm", "replayed"]
    finally:
        proxy.close()


def test_push_replicas_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="push_replicas must not be negative"):
        Config(push_replicas=-1)
    with pytest.raises(ConfigError, match="push_replicas_timeout must be positive"):
        Config(push_replicas_timeout=0)
    config = Config.load(env={"WURK_PUSH_REPLICAS": "2", "WURK_PUSH_REPLICAS_TIMEOUT": "0.5"})
    assert (config.push_replicas, config.push_replicas_timeout) == (2, 0.5)
    assert Client(Config()).confirmed is None


def test_unreachable_redis_is_still_a_connection_error(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False, redis_connect_timeout=0.2)
    pair.primary.stop()
    with pytest.raises(redis.ConnectionError):
        client.push({"class": "Echo", "args": [1]})

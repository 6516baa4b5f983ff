"""Replica-confirmed pushes (``push_replicas``): a push counts once replicas
hold it, and sending it again never enqueues it twice.

Real servers on loopback: a primary and a replica, which the tests detach
(``REPLICAOF NO ONE``, as a promotion does) and reattach.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from conftest import RedisServer, start_redis
from faultproxy import FaultProxy
from waiting import wait_for

from wurk.api import ScheduledSet
from wurk.push import buffered
from wurk.push.buffered import PendingPush
from wurk.push.client import Client
from wurk.push.confirmed import ConfirmedPush, PushNotConfirmedError
from wurk.redis.policy import ConnectError
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config, ConfigError
from wurk.wire import keys

# These tests push to a Redis that never answered on purpose (its buffering is
# what they test); tests/test_push_nowhere.py covers the warning that says so.
pytestmark = pytest.mark.filterwarnings("ignore::wurk.PushSpooledWarning")

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


_configs: list[Config] = []


@pytest.fixture(autouse=True)
def close_pools() -> Iterator[None]:
    """Close every test client's connections, so none is left to the collector."""
    yield
    while _configs:
        close_runtime(_configs.pop())


def make_client(url: str, **settings: Any) -> Client:
    """A confirming client; tests that expect no confirmation shorten the wait."""
    settings.setdefault("push_replicas_timeout", 2.0)
    settings.setdefault("redis_retry_attempts", 2)
    config = Config(redis_url=url, push_replicas=1, redis_retry_base=0.01,
                    log_level="warning", **settings)
    _configs.append(config)
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
    client = make_client(pair.primary.url, reliable_push=False, **UNCONFIRMED)
    pair.detach()
    item = {"class": "Echo", "args": ["once"], "jid": "a" * 24}
    with pytest.raises(PushNotConfirmedError, match=r"only 0 of 1 replicas") as caught:
        client.push(item)
    assert caught.value.jids == ("a" * 24,)
    with pytest.raises(PushNotConfirmedError):
        caught.value.retry()  # still no replica: refused again, and still one copy
    assert queued(pair.primary) == ["once"]
    pair.attach()
    caught.value.retry()
    assert queued(pair.primary) == ["once"]
    assert queued(pair.replica) == ["once"]


def test_a_resend_on_a_fresh_connection_waits_for_the_first_write(pair: Pair) -> None:
    """A resend on a new connection, finding its job already there, must not
    be confirmed by a replica that never received the job. The script renews
    the marker (a write) so that WAIT covers the first write even where a
    new connection's WAIT would only cover its own writes. The Redis 7 this
    suite runs already starts a new connection at the server's current
    offset, so here the test guards the behaviour, not the renewal itself."""
    client = make_client(pair.primary.url, reliable_push=False, **UNCONFIRMED)
    pair.replica.proc.send_signal(signal.SIGSTOP)  # connected, but acknowledging nothing
    try:
        with pytest.raises(PushNotConfirmedError) as caught:
            client.push({"class": "Echo", "args": ["held back"]})
        client.pool.close()  # the resend dials a new connection
        with pytest.raises(PushNotConfirmedError):
            caught.value.retry()
    finally:
        pair.replica.proc.send_signal(signal.SIGCONT)
    pair.wait_in_sync()
    caught.value.retry()
    assert queued(pair.replica) == ["held back"]
    assert queued(pair.primary) == ["held back"]


def test_a_new_push_of_a_known_jid_is_not_mistaken_for_a_resend(pair: Pair) -> None:
    """The classic poller and the admin API push a job again under its jid;
    the marker of its first push must not swallow that."""
    client = make_client(pair.primary.url)
    config = client.config
    jid = client.push({"class": "Echo", "args": ["later"], "at": time.time() + 3600})
    [entry] = ScheduledSet(config=config)
    assert entry.jid == jid
    assert entry.add_to_queue()
    assert queued(pair.replica) == ["later"]
    with pair.replica.client() as c:
        assert c.zcard("schedule") == 0
    # A caller's own jid, pushed twice on purpose: two pushes, two jobs.
    again = {"class": "Echo", "args": ["twice"], "jid": "c" * 24}
    client.push(again)
    client.push(again)
    assert queued(pair.primary) == ["later", "twice", "twice"]


def test_a_push_the_primary_took_after_the_replica_was_promoted_is_never_reported_done(
        pair: Pair) -> None:
    """The failover window: the old primary still takes writes that the new
    one will never have. The push must not count as done, and its resend
    must reach the new primary once."""
    old, new = pair.primary, pair.replica
    # The client reaches Redis through an address that a failover moves, as
    # a virtual IP (or Sentinel, for a Sentinel-aware pool) would.
    address = FaultProxy(old.port)
    try:
        client = make_client(address.url, reliable_push=False, **UNCONFIRMED)
        make_client(address.url, reliable_push=False).push({"class": "Echo", "args": ["before"]})
        pair.detach()  # the replica is now a primary of its own
        with pytest.raises(PushNotConfirmedError) as caught:
            client.push({"class": "Echo", "args": ["in the window"]})
        assert queued(old) == ["before", "in the window"]
        assert queued(new) == ["before"]
        address.upstream = ("127.0.0.1", new.port)
        client.pool.close()  # idle connections still lead to the old primary
        # However often it is sent, it lands once; unconfirmed while the new
        # primary has no replica of its own.
        for _ in range(2):
            with pytest.raises(PushNotConfirmedError):
                caught.value.retry()
        assert queued(new) == ["before", "in the window"]
    finally:
        address.close()


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
    with pytest.raises(ConfigError, match="push_replicas must be from 0 to 100"):
        Config(push_replicas=-1)
    with pytest.raises(ConfigError, match=r"push_replicas_timeout must be from 0\.01 to 60"):
        Config(push_replicas_timeout=0)
    config = Config.load(env={"WURK_PUSH_REPLICAS": "2", "WURK_PUSH_REPLICAS_TIMEOUT": "0.5"})
    assert (config.push_replicas, config.push_replicas_timeout) == (2, 0.5)
    assert Client(Config()).confirmed is None
    # With Sentinel there is a replica to fail over to: confirm on one unless told.
    sentinel = {"sentinels": ["127.0.0.1:1"], "sentinel_master": "m"}
    assert Config(**sentinel).replicas_to_confirm == 1
    assert Config(push_replicas=0, **sentinel).replicas_to_confirm == 0
    assert Config(push_replicas=2).replicas_to_confirm == 2
    assert Config().replicas_to_confirm == 0


def test_unreachable_redis_is_still_a_connection_error(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False, redis_connect_timeout=0.2)
    pair.primary.stop()
    with pytest.raises(redis.ConnectionError):
        client.push({"class": "Echo", "args": [1]})


def test_the_replay_limit_counts_from_the_first_send_that_may_have_landed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A buffered confirmed push is given up once its markers may be gone,
    but only a send that reached Redis starts that clock."""
    monkeypatch.setattr(buffered, "REPLAY_LIMIT", 60.0)
    push = PendingPush(lambda attempts: None, ("j",), replayable=True)
    assert push.worth_keeping(ConnectError("refused"))
    assert push.maybe_landed is None
    unconfirmed = PushNotConfirmedError(ConfirmedPush(()), 0, 1, 1.0, lambda: None)
    assert push.worth_keeping(unconfirmed)
    assert push.maybe_landed is not None
    monkeypatch.setattr(buffered, "REPLAY_LIMIT", 0.0)
    assert not push.worth_keeping(unconfirmed)
    # Nothing-applied failures stay worth keeping whatever the clock says.
    assert push.worth_keeping(ConnectError("refused"))
    # A plain push that may have landed is never sent again.
    plain = PendingPush(lambda attempts: None, ("k",))
    assert not plain.worth_keeping(redis.ConnectionError("reset after sending"))


def test_an_outage_longer_than_the_replay_limit_loses_no_push(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffered, "REPLAY_LIMIT", 2.0)
    client = make_client(pair.primary.url, redis_connect_timeout=0.2)
    assert client.buffer is not None
    pair.primary.stop()
    jids = [client.push({"class": "Echo", "args": [i]}) for i in range(3)]
    assert len(client.buffer) == 3
    time.sleep(2.5)  # longer than the limit, and nothing reached Redis
    restarted = start_redis(*FAST_SYNC, port=pair.primary.port)
    try:
        # The replica follows the restarted primary by itself.
        assert client.buffer.flush(15), f"{len(client.buffer)} still buffered"
        with pair.replica.client() as c:
            assert [json.loads(raw)["jid"] for raw in reversed(c.lrange("queue:default", 0, -1))] \
                == jids
    finally:
        restarted.stop()
        shutil.rmtree(restarted.workdir, ignore_errors=True)


def test_a_flushed_script_cache_is_reloaded(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False)
    client.push({"class": "Echo", "args": ["first"]})
    with pair.primary.client() as c:
        c.script_flush()  # as after a restart: EVALSHA answers NOSCRIPT
    client.push({"class": "Echo", "args": ["second"]})
    assert queued(pair.replica) == ["first", "second"]


def test_a_replica_wait_longer_than_the_read_timeout_is_not_a_timeout(pair: Pair) -> None:
    client = make_client(pair.primary.url, reliable_push=False, redis_read_timeout=0.5,
                         push_replicas_timeout=1.0, redis_retry_attempts=1)
    pair.detach()
    started = time.monotonic()
    with pytest.raises(PushNotConfirmedError):
        client.push({"class": "Echo", "args": ["slow"]})
    assert time.monotonic() - started >= 1.0
    assert queued(pair.primary) == ["slow"]

"""End-to-end tests of the pool's apply-safety against real redis-servers.

Faults come from :class:`faultproxy.FaultProxy` in front of the session
server; READONLY and AUTH come from extra servers started for the test. Each
test checks what the caller saw (result or exception, reported actions,
sleeps) and what Redis actually holds, which is the point: exactly-once or
a loud refusal, never a silent double apply.
"""

from __future__ import annotations

import select
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pools
import pytest
import redis
import redis.exceptions as rx
from conftest import RedisServer, reap_probe_clients, start_redis
from faultproxy import FaultProxy
from recording import Recorder

from wurk.redis.connection import Conn
from wurk.redis.deadline import DeadlinePassed
from wurk.redis.policy import ConnectError
from wurk.redis.pool import RedisPool, RetrySettings


@pytest.fixture
def extra_servers() -> Iterator[Callable[..., RedisServer]]:
    """Start more redis-servers for one test; stop them all afterwards."""
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        server = start_redis(*args)
        started.append(server)
        reap_probe_clients()
        return server

    yield start
    for server in started:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def proxy(redis_server: RedisServer, r: redis.Redis) -> Iterator[FaultProxy]:
    """A fault proxy in front of the (flushed) session redis-server."""
    reap_probe_clients()
    fault_proxy = FaultProxy(redis_server.port)
    yield fault_proxy
    fault_proxy.close()
    assert fault_proxy.threads_alive() == 0


rec = pools.rec
sleeps = pools.sleeps


@pytest.fixture
def make_pool(rec: Recorder, sleeps: list[float]) -> Iterator[Callable[..., RedisPool]]:
    pools: list[RedisPool] = []

    def make(url: str, **kwargs: Any) -> RedisPool:
        kwargs.setdefault("sleep", sleeps.append)
        kwargs.setdefault("retry", RetrySettings(max_attempts=4, base=0.01, cap=0.05,
                                                 checkout_timeout=0.5))
        pool = RedisPool(url, size=2, connect_timeout=0.5, read_timeout=1.0,
                         on_error=rec, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


class Counted:
    """Wraps a block and counts how many times the pool ran it."""

    def __init__(self, block: Callable[[Conn], Any]) -> None:
        self.block = block
        self.runs = 0

    def __call__(self, conn: Conn) -> Any:
        self.runs += 1
        return self.block(conn)


def warm_up(pool: RedisPool) -> None:
    """Dial before arming a fault, so the fault hits the command, not the handshake."""
    assert pool.call("PING", idempotent=True) == b"PONG"


def lpush(conn: Conn) -> Any:
    return conn.call("LPUSH", "q", "job")


# (a) ----------------------------------------------------------------------------

@pytest.mark.parametrize("refusal", ["not listening", "reset on accept"])
def test_failed_dial_is_replayed_for_a_non_idempotent_block(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        r: redis.Redis, refusal: str) -> None:
    slept: list[float] = []

    def sleep_then_heal(seconds: float) -> None:
        slept.append(seconds)
        proxy.heal()

    if refusal == "not listening":
        proxy.refuse()
    else:
        proxy.refuse(1)  # accepted, then reset during redis-py's handshake
    pool = make_pool(proxy.url, sleep=sleep_then_heal)
    block = Counted(lpush)
    assert pool.run(block) == 1
    assert block.runs == 2
    assert rec.actions == [("retry", 1)]
    assert isinstance(rec.calls[0][0], ConnectError)
    assert len(slept) == 1
    assert r.lrange("q", 0, -1) == ["job"]  # landed exactly once


# (b) ----------------------------------------------------------------------------

def test_lost_reply_of_a_non_idempotent_block_is_not_replayed(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        sleeps: list[float], r: redis.Redis) -> None:
    pool = make_pool(proxy.url)
    warm_up(pool)
    proxy.drop_next_reply()
    block = Counted(lpush)
    with pytest.raises(rx.ConnectionError) as raised:
        pool.run(block)
    assert not isinstance(raised.value, ConnectError)
    assert block.runs == 1
    assert rec.actions == [("unsafe", 1)]
    assert rec.calls[0][0] is raised.value
    assert sleeps == []
    assert r.lrange("q", 0, -1) == ["job"]  # applied once: no blind replay
    # The pool recovers: the next block dials afresh and works.
    assert pool.call("LLEN", "q", idempotent=True) == 1


# (c) ----------------------------------------------------------------------------

def test_lost_reply_of_an_idempotent_block_is_replayed(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        sleeps: list[float], r: redis.Redis) -> None:
    pool = make_pool(proxy.url)
    warm_up(pool)
    assert proxy.accepted == 1
    proxy.drop_next_reply()

    def set_get(conn: Conn) -> Any:
        conn.call("SET", "k", "v")
        return conn.call("GET", "k")

    block = Counted(set_get)
    assert pool.run(block, idempotent=True) == b"v"
    assert block.runs == 2
    assert rec.actions == [("retry", 1)]
    assert len(sleeps) == 1 and 0.01 <= sleeps[0] <= 0.015
    assert proxy.accepted == 2  # re-dialed
    assert r.get("k") == "v"


def test_read_timeout_of_a_non_idempotent_block_is_not_replayed(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        r: redis.Redis) -> None:
    pool = RedisPool(proxy.url, read_timeout=0.2, on_error=rec, sleep=lambda _: None)
    try:
        warm_up(pool)
        proxy.delay(0.5)
        block = Counted(lpush)
        with pytest.raises(rx.TimeoutError):
            pool.run(block)
        proxy.heal()
        assert block.runs == 1
        assert rec.actions == [("unsafe", 1)]
        assert r.lrange("q", 0, -1) == ["job"]  # it reached Redis; it was not re-sent
    finally:
        pool.close()


# (d) ----------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["request dropped", "re-dial refused"])
def test_block_with_a_completed_round_trip_is_not_replayed(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        sleeps: list[float], r: redis.Redis, fault: str) -> None:
    pool = make_pool(proxy.url)
    warm_up(pool)

    def two_round_trips(conn: Conn) -> Any:
        conn.call("LPUSH", "q", "first")
        if fault == "request dropped":
            proxy.drop_next_request()
        else:
            conn.close()
            proxy.refuse()
        return conn.call("LPUSH", "q", "second")

    block = Counted(two_round_trips)
    with pytest.raises(rx.ConnectionError) as raised:
        pool.run(block)
    proxy.heal()
    assert isinstance(raised.value, ConnectError) == (fault == "re-dial refused")
    assert block.runs == 1
    assert rec.actions == [("unsafe", 1)]
    assert sleeps == []
    assert r.lrange("q", 0, -1) == ["first"]  # the first LPUSH applied once only


# (e) ----------------------------------------------------------------------------

def wait_for_link(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while replica.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "replica never synced"
        time.sleep(0.02)


def test_readonly_reply_is_retried_once_then_raised(
        redis_server: RedisServer, r: redis.Redis, extra_servers: Callable[..., RedisServer],
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float]) -> None:
    r.config_set("repl-diskless-sync-delay", 0)  # sync at once, not after 5 s
    replica = extra_servers("--replicaof", "127.0.0.1", str(redis_server.port))
    with replica.client() as replica_client:
        wait_for_link(replica_client)  # never LOADING under the test
    pool = make_pool(replica.url)
    block = Counted(lpush)
    with pytest.raises(rx.ReadOnlyError) as raised:
        pool.run(block)
    assert block.runs == 2  # one immediate reconnect-and-retry, no more
    assert rec.actions == [("retry", 1), ("exhausted", 2)]
    assert rec.calls[1][0] is raised.value
    assert sleeps == []
    assert r.llen("q") == 0
    # Reads still work on the replica; the refused write never counted as applied.
    r.set("seen", "1")
    deadline = time.monotonic() + 5
    while pool.call("GET", "seen", idempotent=True) != b"1":
        assert time.monotonic() < deadline
        time.sleep(0.01)


# (f) ----------------------------------------------------------------------------

def wait_readable(conn: Conn) -> None:
    sock = conn.raw._sock
    assert sock is not None
    assert select.select([sock], [], [], 2.0)[0], "the server never closed the socket"


@pytest.mark.parametrize("how", ["CLIENT KILL", "proxy half-close"])
def test_stale_idle_socket_is_redialed_for_a_non_idempotent_block(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool], rec: Recorder,
        sleeps: list[float], r: redis.Redis, how: str) -> None:
    pool = make_pool(proxy.url)
    conn, client_id = pool.run(lambda c: (c, c.call("CLIENT", "ID")))
    if how == "CLIENT KILL":
        assert r.client_kill_filter(_id=client_id) == 1
    else:
        proxy.half_close()
    wait_readable(conn)  # the EOF is there before the next block starts
    block = Counted(lpush)
    disruptions = pool.disruptions
    assert pool.run(block) == 1
    assert block.runs == 1
    assert rec.calls == []  # re-dialed transparently, nothing to report
    # ... but counted: the server behind it may have changed (a failover
    # kills the clients of the servers it reconfigures).
    assert pool.disruptions == disruptions + 1
    assert sleeps == []
    assert proxy.accepted == 2
    assert r.lrange("q", 0, -1) == ["job"]
    assert pool.call("CLIENT", "ID") != client_id


# (g) ----------------------------------------------------------------------------

@pytest.fixture
def auth_server(extra_servers: Callable[..., RedisServer]) -> RedisServer:
    """A server requiring the password "secret".

    Set after start: conftest's ``start_redis`` probes with a password-less
    PING, so it cannot start a server with ``--requirepass`` itself.
    """
    server = extra_servers()
    with server.client() as client:
        assert client.config_set("requirepass", "secret")
    return server


def test_auth_with_the_right_password(auth_server: RedisServer,
                                      make_pool: Callable[..., RedisPool],
                                      rec: Recorder) -> None:
    pool = make_pool(f"redis://:secret@127.0.0.1:{auth_server.port}/0")
    assert pool.call("SET", "k", "v") == b"OK"
    assert pool.call("GET", "k", idempotent=True) == b"v"
    assert rec.calls == []


@pytest.mark.parametrize("auth", [":wrong@", ""], ids=["wrong password", "no password"])
@pytest.mark.parametrize("idempotent", [False, True])
def test_auth_failure_raises_at_once_without_retries(
        auth_server: RedisServer, make_pool: Callable[..., RedisPool],
        rec: Recorder, sleeps: list[float], auth: str, idempotent: bool) -> None:
    pool = make_pool(f"redis://{auth}127.0.0.1:{auth_server.port}/0")
    block = Counted(lambda c: c.call("PING"))
    with pytest.raises(rx.AuthenticationError):
        pool.run(block, idempotent=idempotent)
    assert block.runs == 1
    assert rec.calls == []
    assert sleeps == []


# An interrupted block must not leave its reply for the next one to read. ------

def test_interrupted_block_does_not_leave_a_stale_reply(
        proxy: FaultProxy, make_pool: Callable[..., RedisPool]) -> None:
    pool = make_pool(proxy.url)
    warm_up(pool)
    proxy.delay(0.3)  # the reply is still in flight when the next block starts

    def interrupted(conn: Conn) -> None:
        conn.raw.send_command("ECHO", "stale")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pool.run(interrupted)
    proxy.heal()
    assert pool.call("ECHO", "fresh", idempotent=True) == b"fresh"


# -- the pool's deadline (a drain) -----------------------------------------------------

def test_past_the_deadline_nothing_is_dialed_or_sent(proxy: FaultProxy, rec: Recorder,
                                                      make_pool: Callable[..., RedisPool]) -> None:
    pool = make_pool(proxy.url)
    with pool.deadline.bounded(time.monotonic() - 1), pytest.raises(DeadlinePassed):
        pool.call("SET", "late", "1", idempotent=True)
    assert proxy.accepted == 0
    assert rec.actions == [("deadline", 1)]


def test_retries_stop_at_the_deadline(proxy: FaultProxy, rec: Recorder,
                                      make_pool: Callable[..., RedisPool]) -> None:
    pool = make_pool(proxy.url, sleep=time.sleep,
                     retry=RetrySettings(max_attempts=30, base=0.2, cap=1.0))
    proxy.refuse()
    started = time.monotonic()
    with pool.deadline.bounded(started + 0.5), pytest.raises(ConnectError):
        pool.call("PING", idempotent=True)
    # Without the deadline: thirty attempts, about 25 s of pauses; with it 0.5 s,
    # and ten times that on a loaded machine.
    assert time.monotonic() - started < 5.0
    assert rec.actions[-1][0] == "deadline"
    assert pool.deadline.at is None  # the bound ends with its block


def test_a_read_is_clipped_to_the_deadline(proxy: FaultProxy, rec: Recorder) -> None:
    pool = RedisPool(proxy.url, read_timeout=30.0, on_error=rec)
    try:
        pool.call("PING")  # warm: the dial is not what is measured
        proxy.delay(15)  # unclipped, the reply would come (and no timeout) after 15 s
        started = time.monotonic()
        with pool.deadline.bounded(started + 0.3), pytest.raises(rx.TimeoutError):
            pool.call("PING", idempotent=True)
        assert time.monotonic() - started < 5.0  # the 0.3 s deadline, not the 15 s reply
    finally:
        pool.close()


def test_a_tls_dial_to_a_plain_port_ends_at_the_connect_timeout(
        redis_server: RedisServer, rec: Recorder) -> None:
    # A plain redis-server never answers the ClientHello: before, the
    # handshake ran on the read timeout (here 30 s).
    pool = RedisPool(f"rediss://127.0.0.1:{redis_server.port}/0", connect_timeout=0.3,
                     read_timeout=30.0, retry=RetrySettings(max_attempts=1), on_error=rec)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectError):
            pool.call("PING", idempotent=True)
        assert time.monotonic() - started < 5.0  # the 0.3 s connect timeout, not the 30 s read
    finally:
        pool.close()

"""Waiting for Redis at start (wurk.redis.wait) against a real redis-server."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis.exceptions as rx
from conftest import RedisServer, free_port, reap_probe_clients, start_redis
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from waiting import wait_for

from wurk.redis.pool import RedisPool
from wurk.redis.wait import PAUSES, wait_for_redis, wait_or_signal


def test_each_attempt_logs_the_url_without_its_password() -> None:
    pool = RedisPool(f"redis://:hunter2@127.0.0.1:{free_port()}/0", connect_timeout=0.5)
    stop = threading.Event()
    try:
        with capture_logs() as logs:
            waiter = threading.Thread(target=wait_for_redis, args=(pool, stop))
            waiter.start()
            wait_for(lambda: any(e["event"] == "redis.unreachable" for e in logs))
            stop.set()
            waiter.join(10)
        line = next(e for e in logs if e["event"] == "redis.unreachable")
        assert line["url"] == f"redis://:***@127.0.0.1:{pool.url.rsplit(':', 1)[1]}"
        assert "hunter2" not in repr(logs)
    finally:
        pool.close()


def test_pause_doubles_from_half_a_second_to_ten() -> None:
    assert [PAUSES.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert PAUSES.delay(10_000) == 10.0



def test_wait_logs_each_attempt_and_returns_once_redis_answers(proxy: FaultProxy) -> None:
    pool = RedisPool(proxy.url, connect_timeout=0.5)
    proxy.refuse()
    try:
        with capture_logs() as logs:
            result: list[bool] = []
            waiter = threading.Thread(target=lambda: result.append(
                wait_for_redis(pool, threading.Event())))
            waiter.start()
            wait_for(lambda: sum(e["event"] == "redis.unreachable" for e in logs) >= 2)
            proxy.heal()
            waiter.join(10)
        assert result == [True]
        lines = [e for e in logs if e["event"] == "redis.unreachable"]
        assert [e["attempt"] for e in lines[:2]] == [1, 2]
        assert all(e["url"] == proxy.url for e in lines)
        assert logs[-1]["event"] == "redis.reachable"
    finally:
        pool.close()


def test_wait_gives_up_when_told_to_stop(proxy: FaultProxy) -> None:
    pool = RedisPool(proxy.url, connect_timeout=0.5)
    proxy.refuse()
    stop = threading.Event()
    stop.set()
    try:
        assert wait_for_redis(pool, stop) is False
    finally:
        pool.close()


def test_a_refusal_waiting_cannot_fix_is_raised_at_once() -> None:
    secured = start_redis()
    with secured.client() as client:
        client.config_set("requirepass", "right")  # after start: start_redis pings without it
    reap_probe_clients()
    pool = RedisPool(f"redis://:wrong@127.0.0.1:{secured.port}/0")
    try:
        started = time.monotonic()
        with pytest.raises(rx.AuthenticationError):
            wait_for_redis(pool, threading.Event())
        assert time.monotonic() - started < 5.0  # raised, not waited out with backoff
    finally:
        pool.close()
        secured.stop()


def test_a_signal_ends_the_wait_even_in_the_middle_of_a_dial(
        redis_server: RedisServer) -> None:
    # TLS to a plain port: the dial hangs until the connect timeout (30 s here).
    pool = RedisPool(f"rediss://127.0.0.1:{redis_server.port}/0", connect_timeout=30)
    reader, writer = socket.socketpair()
    try:
        threading.Timer(0.3, lambda: writer.send(bytes([15]))).start()
        started = time.monotonic()
        assert wait_or_signal(pool, reader, writer, lambda n: n == 15) is False
        assert time.monotonic() - started < 5.0  # the signal at 0.3 s, not the 30 s dial
    finally:
        reader.close()
        writer.close()
        pool.close()

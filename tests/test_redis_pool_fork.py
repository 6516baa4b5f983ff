"""A RedisPool across fork: the child never reuses a connection of the
parent's, idle or checked out, and the parent's own stays usable.

A real connection to the session redis-server, so the child has one to
inherit; the pool's sleeps and error hook come from tests/pools.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pools
import pytest
from conftest import reap_probe_clients

from wurk.redis.connection import Conn
from wurk.redis.pool import RedisPool

if TYPE_CHECKING:
    from conftest import RedisServer

rec = pools.rec
sleeps = pools.sleeps
make_pool = pools.make_pool


def client_id(conn: Conn) -> tuple[Conn, int]:
    return conn, int(conn.call("CLIENT", "ID"))


def child_report(pool: RedisPool, parent_conn: Conn, wfd: int) -> None:
    """In the child: use the pool, write what was seen to the pipe, exit."""
    code = 1
    try:
        idle_after_fork = len(pool.idle_connections())
        conn, cid = pool.run(client_id)
        report = {"idle_after_fork": idle_after_fork, "reused": conn is parent_conn,
                  "cid": cid, "parent_copy_closed": parent_conn.raw._sock is None}
        os.write(wfd, json.dumps(report).encode())
        code = 0
    except Exception as exc:  # noqa: BLE001 - the child must never unwind into pytest
        os.write(wfd, json.dumps({"error": repr(exc)}).encode())
    finally:
        os._exit(code)


def collect(pid: int, rfd: int, wfd: int) -> dict[str, Any]:
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 4096):
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


@pytest.fixture
def live_pool(redis_server: RedisServer, make_pool: Callable[..., RedisPool]) -> RedisPool:
    reap_probe_clients()
    return make_pool(url=redis_server.url, size=2)


def test_forked_child_never_reuses_the_parents_idle_connection(live_pool: RedisPool) -> None:
    parent_conn, parent_cid = live_pool.run(client_id)
    assert live_pool.idle_connections() == [parent_conn]
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        child_report(live_pool, parent_conn, wfd)
    report = collect(pid, rfd, wfd)
    assert report["idle_after_fork"] == 0
    assert report["reused"] is False
    assert report["parent_copy_closed"] is True
    assert report["cid"] != parent_cid  # the child dialed its own connection
    # The child closed only its copy: the parent's socket still works, same session.
    conn, cid = live_pool.run(client_id)
    assert conn is parent_conn
    assert cid == parent_cid
    assert live_pool.call("ECHO", "still here") == b"still here"


def test_connection_checked_out_across_fork_is_dropped_in_the_child(
        live_pool: RedisPool) -> None:
    seen: dict[str, Any] = {}

    def fork_inside(conn: Conn) -> int:
        seen["conn"], seen["cid"] = client_id(conn)
        return os.fork()

    rfd, wfd = os.pipe()
    pid = live_pool.run(fork_inside)
    if pid == 0:
        # run() checked the parent's Conn back in; in the child it must be dropped.
        child_report(live_pool, seen["conn"], wfd)
    report = collect(pid, rfd, wfd)
    assert report["idle_after_fork"] == 0
    assert report["reused"] is False
    assert report["cid"] != seen["cid"]
    conn, cid = live_pool.run(client_id)
    assert conn is seen["conn"]
    assert cid == seen["cid"]

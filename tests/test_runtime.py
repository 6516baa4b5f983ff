"""The per-process runtime (wurk.redis.runtime): one per config object, built
at boot, handed down, and reset after a real fork in one place."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.redis import runtime as runtimes
from wurk.redis.connection import Conn
from wurk.redis.pool import RedisPool
from wurk.redis.runtime import Runtime, close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

T = TypeVar("T")


def test_one_runtime_per_config_object_and_a_copy_gets_its_own(config: Config) -> None:
    runtime = runtime_for(config)
    assert runtime_for(config) is runtime
    assert runtime.config is config
    copy = dataclasses.replace(config)
    assert copy == config
    assert runtime_for(copy) is not runtime
    close_runtime(copy)


def test_a_closed_runtime_is_built_afresh_and_the_replaced_default_closes(
        config: Config, redis_server: Any) -> None:
    runtime = runtime_for(config)
    runtime.pool.call("PING", idempotent=True)
    close_runtime(config)
    assert runtime.pool.idle_connections() == []
    assert runtime_for(config) is not runtime
    later = runtime_for(config)
    later.pool.call("PING", idempotent=True)
    wurk.configure(Config(redis_url=redis_server.url))
    assert later.pool.idle_connections() == []
    assert runtime_for(config) is not later


class CountingPool(RedisPool):
    """A real pool that counts the blocks run through it."""

    runs = 0

    def run(self, block: Callable[[Conn], T], *, idempotent: bool = False,
            attempts: int | None = None) -> T:
        self.runs += 1
        return super().run(block, idempotent=idempotent, attempts=attempts)


def test_a_launcher_and_what_it_starts_share_the_runtime_it_was_handed(
        config: Config, r: redis.Redis) -> None:
    runtime = Runtime(config, pool=CountingPool.from_config(config))
    launcher = Launcher(config, runtime=runtime)
    parts = [launcher, launcher.manager, launcher.manager.fetch, launcher.heartbeat,
             launcher.poller, launcher.reaper, launcher.manager.lifecycle]
    assert {id(part.runtime) for part in parts} == {id(runtime)}
    launcher.start()
    try:
        # The beat, the fetch and the scheduler all go through the pool handed in.
        wait_for(lambda: r.exists(launcher.identity))
        assert isinstance(runtime.pool, CountingPool)
        wait_for(lambda: runtime.pool.runs > 3)
    finally:
        launcher.stop(time.monotonic() + 10)
        runtime.close()


def ponged(reply: Any) -> bool:
    # A parsed reply (True) or the raw one, whichever the pool's connection gives.
    return reply is True or reply in (b"PONG", "PONG")


async def _ping(runtime: Runtime) -> None:
    pool = runtime.apool()
    assert runtime.apool() is pool
    assert ponged(await pool.call("PING", idempotent=True))


def test_a_forked_child_drops_the_parents_sockets_and_asyncio_pools(config: Config) -> None:
    runtime = runtime_for(config)
    runtime.pool.call("PING", idempotent=True)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_ping(runtime))
        assert len(runtime.async_pools()) == 1
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child_report(runtime, wfd)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as pipe:
            report = json.loads(pipe.read() or b"{}")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, report
        assert report == {"idle": 0, "apools": 0, "ping": True}
        # The parent's pool kept its own connection.
        assert runtime.pool.idle_connections()
    finally:
        loop.run_until_complete(_close_async_pools(runtime))
        loop.close()


async def _close_async_pools(runtime: Runtime) -> None:
    for pool in runtime.async_pools():
        await pool.close()


def _child_report(runtime: Runtime, wfd: int) -> None:
    code = 1
    try:
        idle = len(runtime.pool.idle_connections())
        # The inherited loop is the parent's: its pool is not the child's to use.
        apools = len(runtime.async_pools())
        ping = ponged(runtime.pool.call("PING", idempotent=True))
        os.write(wfd, json.dumps({"idle": idle, "apools": apools, "ping": ping}).encode())
        code = 0
    except Exception as exc:  # noqa: BLE001 - the child must never unwind into pytest
        os.write(wfd, json.dumps({"error": repr(exc)}).encode())
    finally:
        os._exit(code)


def test_a_child_forked_while_a_runtime_was_being_built_can_build_its_own(
        config: Config) -> None:
    # A thread of the parent's was building a runtime at the fork (a prefork
    # server forking while a request thread makes its first Client): the
    # child has no such thread, so it must not wait on that thread's lock.
    held, done = threading.Event(), threading.Event()

    def building() -> None:
        with runtimes._building:
            held.set()
            done.wait(EVENTUALLY)

    thread = threading.Thread(target=building, daemon=True)
    thread.start()
    try:
        assert held.wait(EVENTUALLY)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                runtime_for(dataclasses.replace(config))
                code = 0
            finally:
                os._exit(code)
    finally:
        done.set()
        thread.join(EVENTUALLY)
    statuses: list[int] = []

    def ended() -> bool:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            statuses.append(status)
        return bool(statuses)

    try:
        wait_for(ended, timeout=EVENTUALLY, what="the child built a runtime and exited")
    finally:
        if not statuses:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(statuses[0]) == 0


def test_blocking_waits_have_a_pool_of_their_own_that_closes_with_the_runtime(
        config: Config, r: redis.Redis) -> None:
    cfg = dataclasses.replace(config)
    runtime = runtime_for(cfg)
    waits = runtime.wait_pool()
    assert waits is runtime.wait_pool() and waits is not runtime.pool
    assert waits.size == runtimes.WAIT_CONNECTIONS
    name = f"waits-{os.getpid()}"
    waits.call("CLIENT", "SETNAME", name)

    def named() -> bool:
        return any(c.get("name") == name for c in r.client_list())

    assert named()
    close_runtime(cfg)
    wait_for(lambda: not named(), what="the wait pool's connection closed")

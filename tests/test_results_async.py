"""``await wurk.aresult(jid)``: the async form of ``wurk.result``, on an asyncio pool,
with the same answers and errors; and the decisions both forms share.

Coroutines run with ``asyncio.run`` inside plain tests: no pytest plugin.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis
from conftest import RedisServer, start_redis

import wurk
from wurk.api import Queue
from wurk.redis.runtime import close_runtime
from wurk.results import client as push_results
from wurk.results import records as wire
from wurk.results.client import (
    Block,
    JobFailed,
    ResultTimeout,
    Waiting,
    apeek,
    await_outcome,
)
from wurk.results.records import CorruptResultError, Outcome
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

Define = Callable[..., Any]
Launch = Callable[..., Launcher]
T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def store(r: redis.Redis, jid: str, value: Any) -> None:
    """Write a final success record as a worker would."""
    record, final = wire.success_record({"jid": jid, "class": "C"}, value, time.time())
    r.eval(wire.STORE.source, 2, wire.key(jid), wire.ready_key(jid), record, 60,
           "1" if final else "0")


# -- the decisions, without Redis ------------------------------------------------------

def outcome(final: bool, jid: str = "j") -> Outcome:
    raw = (f'{{"status": "failed", "error": {{"class": "E", "message": "m", '
           f'"final": {"true" if final else "false"}}}}}')
    return wire.parse(jid, raw)


def test_the_decisions_block_pause_after_a_stale_token_and_time_out(config: Config) -> None:
    waiting = Waiting("j", 10.0, config, now=100.0)
    assert waiting.read(None, 100.0) == Block(0.0, push_results.MAX_BLOCK)
    waiting.blocked(True)  # the token came, yet the record is not final: pause first
    assert waiting.read(outcome(final=False), 108.0) == Block(push_results.STALE_TOKEN_PAUSE,
                                                              2.0)
    final = outcome(final=True)
    assert waiting.read(final, 120.0) is final  # a final record wins, even late
    with pytest.raises(ResultTimeout, match="a retry is pending"):
        waiting.read(outcome(final=False), 110.0)


def test_the_decisions_back_off_through_trouble_and_give_up_at_the_deadline(
        config: Config) -> None:
    config = dataclasses.replace(config, redis_retry_base=0.5, redis_retry_cap=0.5)
    waiting = Waiting("j", 2.0, config, now=0.0)
    trouble = redis.ConnectionError("down")
    pause = waiting.failed(trouble, 0.0)
    assert pause is not None and 0 < pause <= 1.0
    assert waiting.failed(ValueError("a bug"), 0.0) is None  # raised, not waited out
    assert waiting.failed(CorruptResultError("j", "junk"), 0.0) is None
    with pytest.raises(ResultTimeout) as timed_out:
        waiting.failed(trouble, 1.99)
    assert timed_out.value.__cause__ is trouble
    for bad in (None, "", 12):
        with pytest.raises(TypeError, match="jid"):
            Waiting(bad, 1.0, config, now=0.0)
    with pytest.raises(TypeError, match="timeout"):
        Waiting("j", -1, config, now=0.0)


# -- against Redis and a worker ------------------------------------------------------

def test_aresult_gets_the_value_before_and_after_the_job_ends_without_blocking_the_loop(
        config: Config, define: Define, launch: Launch) -> None:
    gate = threading.Event()
    job = define(lambda a, b: gate.wait(10) and {"sum": a + b}, store_result=True)
    launch()
    jid = job.perform_async(2, 3)

    async def main() -> tuple[Any, Any, int]:
        waiter = asyncio.ensure_future(wurk.aresult(jid, timeout=20))
        ticks = 0
        # The loop stays free while the waiter is blocked in Redis.
        while ticks < 20:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not waiter.done() and await apeek(jid) is None
        gate.set()
        early = await waiter
        return early, await wurk.aresult(jid, timeout=0), ticks

    early, late, ticks = run(main())
    assert early == late == {"sum": 5} and ticks == 20


def test_many_coroutines_wait_on_one_jid_more_than_the_pool_holds(
        config: Config, define: Define, launch: Launch) -> None:
    gate = threading.Event()
    job = define(lambda: gate.wait(20) and "all", store_result=True)
    launch()
    jid = job.perform_async()
    waiters = push_results.WAIT_CONNECTIONS + 36

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(wurk.aresult(jid, timeout=20)) for _ in range(waiters)]
        await asyncio.sleep(0.3)
        gate.set()
        return await asyncio.gather(*tasks)

    assert run(main()) == ["all"] * waiters


def test_a_failed_job_raises_jobfailed_as_the_sync_form_does(
        config: Config, define: Define, launch: Launch) -> None:
    def boom(x: int) -> None:
        raise ValueError(f"bad {x}")

    job = define(boom, store_result=True, retry=False)
    launch()
    jid = job.perform_async(7)
    with pytest.raises(JobFailed) as failed:
        run(wurk.aresult(jid, timeout=10))
    assert (failed.value.jid, failed.value.error_class, failed.value.error_message) == (
        jid, "ValueError", "bad 7")
    with pytest.raises(JobFailed) as again:
        wurk.result(jid, timeout=0)
    assert str(again.value) == str(failed.value)


def test_a_job_deleted_by_a_person_tells_its_async_waiter(
        config: Config, define: Define) -> None:
    job = define(lambda: "never runs", store_result=True)
    jid = job.perform_async()

    async def main() -> Outcome:
        waiter = asyncio.ensure_future(await_outcome(jid, timeout=20))
        await asyncio.sleep(0.2)
        record = await asyncio.to_thread(Queue("default", config=config).find_job, jid)
        assert record is not None and await asyncio.to_thread(record.delete)
        return await waiter

    got = run(main())
    assert (got.status, got.error_class, got.final) == ("failed", "JobDeletedError", True)
    with pytest.raises(JobFailed, match="JobDeletedError"):
        run(wurk.aresult(jid, timeout=0))


def test_a_timeout_and_bad_arguments_are_the_sync_forms(config: Config,
                                                       r: redis.Redis) -> None:
    with pytest.raises(ResultTimeout, match="without store_result=True") as timed_out:
        run(wurk.aresult("0123456789abcdef01234567", timeout=0.3))
    assert isinstance(timed_out.value, TimeoutError)
    for bad in (None, "", 12):
        with pytest.raises(TypeError, match="jid"):
            run(wurk.aresult(bad, timeout=0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeout"):
        run(wurk.aresult("abc", timeout=-1))
    r.set(wire.key("j1"), "not json")
    with pytest.raises(CorruptResultError, match="j1"):
        run(wurk.aresult("j1", timeout=0))


def test_each_loop_gets_its_own_wait_pool(config: Config, r: redis.Redis) -> None:
    store(r, "jl", "kept")
    assert run(wurk.aresult("jl", timeout=0)) == "kept"
    assert run(wurk.aresult("jl", timeout=0)) == "kept"  # a second loop: a pool of its own


def test_an_async_waiter_rides_out_a_redis_restart(own_redis: RedisServer) -> None:
    cfg = Config(redis_url=own_redis.url, redis_retry_base=0.05, redis_retry_cap=0.2,
                 log_level="warning")
    blocked = threading.Event()
    got: list[Any] = []

    async def main() -> None:
        waiter = asyncio.ensure_future(wurk.aresult("jr", timeout=20, config=cfg))
        await asyncio.sleep(0.3)  # blocked in BRPOPLPUSH on the server about to go
        blocked.set()
        got.append(await waiter)

    thread = threading.Thread(target=lambda: run(main()))
    thread.start()
    assert blocked.wait(10)
    own_redis.stop()
    time.sleep(0.5)  # the waiter meets the outage: it must keep trying
    restarted = start_redis(port=own_redis.port)
    try:
        assert thread.is_alive()
        with restarted.client() as c:
            store(c, "jr", "after")
        thread.join(20)
        assert got == ["after"]
    finally:
        restarted.stop()
        close_runtime(cfg)

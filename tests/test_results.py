"""Job results (wurk.results.client, wurk.results.step): stored when asked for,
waited on without polling, with in-process workers on a real redis-server."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from conftest import RedisServer, start_redis
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.push.options import make_options
from wurk.redis.runtime import close_runtime
from wurk.results import client as push_results
from wurk.results import records as wire
from wurk.results import step as worker_results
from wurk.results.client import JobFailed, ResultTimeout, peek, wait
from wurk.results.records import CorruptResultError
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.lua import Script

Define = Callable[..., Any]
Launch = Callable[..., Launcher]


def test_the_option_travels_as_result_ttl_and_only_when_on() -> None:
    assert wire.TTL not in make_options().payload_fields()
    assert make_options(store_result=True).payload_fields()[wire.TTL] == wire.DEFAULT_TTL
    on = make_options(store_result=True, result_ttl=60)
    assert on.payload_fields()[wire.TTL] == 60
    assert wire.TTL not in make_options(on, store_result=False).payload_fields()
    for bad in ({"store_result": 1}, {"store_result": "yes"},
                {"store_result": True, "result_ttl": 0},
                {"store_result": True, "result_ttl": 1.5},
                {"store_result": True, "result_ttl": True},
                {"store_result": True, "result_ttl": wire.MAX_TTL + 1},
                {"result_ttl": 60}):
        with pytest.raises(TypeError, match=r"store_result|result_ttl"):
            make_options(**bad)


def test_a_payload_ttl_is_read_without_trusting_it() -> None:
    assert wire.ttl_of({wire.TTL: 30}) == 30
    assert wire.ttl_of({wire.TTL: 0.2}) == 1
    assert wire.ttl_of({wire.TTL: 10**30}) == wire.MAX_TTL
    for junk in ("30", True, None, math.nan, math.inf, [1]):
        assert wire.ttl_of({wire.TTL: junk}) == wire.DEFAULT_TTL


def test_a_waiter_gets_the_value_before_and_after_the_job_ends(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    gate = threading.Event()

    def add(a: int, b: int) -> dict[str, int]:
        assert gate.wait(10)
        return {"sum": a + b}

    job = define(add, store_result=True, result_ttl=120)
    launch()
    jid = job.perform_async(2, 3)
    early: list[Any] = []
    waiter = threading.Thread(target=lambda: early.append(wurk.result(jid, timeout=10)))
    waiter.start()
    time.sleep(0.3)
    assert early == [] and peek(jid) is None  # it blocks: nothing stored yet
    gate.set()
    waiter.join(10)
    assert early == [{"sum": 5}]
    started = time.monotonic()
    assert wurk.result(jid, timeout=0) == {"sum": 5}  # after the end: at once
    assert time.monotonic() - started < 5
    assert 110 < r.ttl(wire.key(jid)) <= 120
    assert 110 < r.ttl(wire.ready_key(jid)) <= 120
    record = json.loads(r.get(wire.key(jid)))
    assert record["status"] == "success" and record["class"] == job.name


def test_many_threads_waiting_on_one_jid_all_get_it(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    gate = threading.Event()
    running = threading.Event()

    def slow() -> str:
        running.set()
        assert gate.wait(10)
        return "done"

    job = define(slow, store_result=True)
    launch()
    jid = job.perform_async()
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(wurk.result, jid, timeout=10) for _ in range(12)]
        assert running.wait(10)  # the job is under way and cannot end before the gate
        time.sleep(0.3)
        assert not any(f.done() for f in futures)
        gate.set()
        assert [f.result(10) for f in futures] == ["done"] * 12
    assert r.llen(wire.ready_key(jid)) == 1  # rotated, never taken away
    assert r.ttl(wire.ready_key(jid)) > 0


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable-fetch", "basic-fetch"])
def test_many_jobs_many_waiters(config: Config, define: Define, launch: Launch,
                                reliable: bool) -> None:
    config = tuned(config, concurrency=8, reliable_fetch=reliable)
    job = define(lambda n: n * n, store_result=True)
    jids = [job.perform_async(n) for n in range(300)]
    with ThreadPoolExecutor(30) as pool:
        # Waiters start first: every job is still queued.
        futures = {n: pool.submit(wurk.result, jid, timeout=30) for n, jid in enumerate(jids)}
        twice = {n: pool.submit(wurk.result, jids[n], timeout=30) for n in range(0, 300, 10)}
        launch()
        assert all(futures[n].result(30) == n * n for n in range(300))
        assert all(twice[n].result(30) == n * n for n in twice)


def test_a_job_that_dies_raises_jobfailed_with_its_error(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    def boom(x: int) -> None:
        raise ValueError(f"bad {x}")

    job = define(boom, store_result=True, retry=False)
    launch()
    jid = job.perform_async(7)
    with pytest.raises(JobFailed) as failed:
        wurk.result(jid, timeout=10)
    error = failed.value
    assert (error.jid, error.error_class, error.error_message) == (jid, "ValueError", "bad 7")
    assert error.outcome.final and not error.outcome.succeeded
    assert "ValueError: bad 7" in str(error)


def test_a_job_dropped_past_its_expiry_fails_its_waiter_at_once(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    ran: list[int] = []
    job = define(ran.append, store_result=True)
    # A payload whose expiry passed while it queued (as a long outage leaves it).
    jid = wurk.Client(config).push({"class": job.name, "args": [1], "result_ttl": 60,
                                    "expiry": time.time() - 5})
    assert jid is not None
    launch()
    with pytest.raises(JobFailed) as failed:
        wurk.result(jid, timeout=10)
    assert failed.value.error_class == "JobExpiredError"
    assert failed.value.outcome.final
    assert ran == []


def test_a_retry_leaves_a_non_final_error_and_waiters_wait_for_the_end(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    def flaky() -> None:
        raise RuntimeError("try again")

    job = define(flaky, store_result=True, retry=1)
    launch()
    jid = job.perform_async()
    wait_for(lambda: r.zcard("retry") == 1)
    first = peek(jid)
    assert first is not None and not first.final and first.error_class == "RuntimeError"
    assert r.llen(wire.ready_key(jid)) == 0  # nobody is woken for a non-final error
    with pytest.raises(ResultTimeout, match="retry is pending") as timed_out:
        wait(jid, timeout=0.3)
    assert timed_out.value.last == first
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            wurk.result(jid, timeout=10)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    # The retry comes due now (the scheduler would move it the same way).
    (entry,) = r.zrange("retry", 0, 0)
    r.zrem("retry", entry)
    r.lpush("queue:default", entry)
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], JobFailed)
    assert outcome[0].outcome.final and outcome[0].outcome.retry_count == 1
    # The result is written first, the dead entry just after it.
    wait_for(lambda: r.zcard("dead") == 1)


def test_a_value_json_cannot_carry_is_an_error_result_and_the_worker_goes_on(
        config: Config, define: Define, launch: Launch, r: redis.Redis) -> None:
    values = {"set": {1, 2}, "nan": math.nan, "tuple": (1, 2), "int key": {1: "a"},
              "deep": [{"ok": [object()]}]}
    job = define(lambda kind: values[kind], store_result=True)
    huge = define(lambda: "x" * (wire.MAX_RECORD_BYTES + 1), store_result=True)
    fine = define(lambda: [1, "two"], store_result=True)
    launch()
    for jid in [job.perform_async(kind) for kind in values] + [huge.perform_async()]:
        with pytest.raises(JobFailed, match="JSON") as failed:
            wurk.result(jid, timeout=10)
        assert failed.value.error_class == wire.UNSERIALIZABLE
    # The message names the part that is not JSON, as a push's check does.
    with pytest.raises(JobFailed, match=r"the return value\[0\]\['ok'\]\[0\] is a object"):
        wurk.result(job.perform_async("deep"), timeout=10)
    assert wurk.result(fine.perform_async(), timeout=10) == [1, "two"]
    # The jobs themselves succeeded: processed, never retried.
    wait_for(lambda: r.get("stat:processed") == "8")
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_a_short_ttl_is_honoured(config: Config, define: Define, launch: Launch,
                                 r: redis.Redis) -> None:
    job = define(lambda: "brief", store_result=True, result_ttl=1)
    launch()
    jid = job.perform_async()
    assert wurk.result(jid, timeout=10) == "brief"
    assert 0 < r.pttl(wire.key(jid)) <= 1000 and 0 < r.pttl(wire.ready_key(jid)) <= 1000
    wait_for(lambda: not r.exists(wire.key(jid), wire.ready_key(jid)))
    assert peek(jid) is None
    with pytest.raises(ResultTimeout, match="expired"):
        wurk.result(jid, timeout=0.2)


def test_a_timeout_says_why_there_may_be_no_result(config: Config) -> None:
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match="without store_result=True") as timed_out:
        wurk.result("0123456789abcdef01234567", timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 10
    assert isinstance(timed_out.value, TimeoutError)
    for bad in (None, "", 12):
        with pytest.raises(TypeError, match="jid"):
            wurk.result(bad, timeout=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeout"):
        wurk.result("abc", timeout=-1)


def test_jobs_that_did_not_ask_store_nothing(config: Config, define: Define,
                                             launch: Launch, r: redis.Redis) -> None:
    plain = define(lambda: "kept nowhere")
    launch()
    plain.perform_async()
    plain.set(store_result=False).perform_async()
    wait_for(lambda: r.get("stat:processed") == "2")
    assert r.keys("wurk:result*") == []


def test_a_corrupt_record_is_a_clear_error(config: Config, r: redis.Redis) -> None:
    for junk in ("not json", "[1]", '{"status": "maybe"}'):
        r.set(wire.key("j1"), junk)
        with pytest.raises(CorruptResultError, match="j1"):
            wurk.result("j1", timeout=0)
    r.set(wire.key("j1"), '{"status": "failed", "error": "nonsense", "retry_count": true}')
    outcome = peek("j1")
    assert outcome is not None and outcome.final and outcome.retry_count is None


def _failing_store(times: int, error: str) -> Script:
    """The store script, refused in Redis itself for its first ``times`` runs
    (counted in the ``faults`` key), as a Redis in trouble refuses it."""
    return Script("result_store_faulty", f"""
if redis.call("incr", "faults") <= {times} then
  return redis.error_reply("{error}")
end
""" + wire.STORE.source)


def test_a_store_through_redis_trouble_is_retried_and_never_fails_the_job(
        config: Config, define: Define, launch: Launch, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tuned(config, redis_retry_base=0.01, redis_retry_cap=0.05)
    monkeypatch.setattr(wire, "STORE", _failing_store(6, "LOADING injected: still loading"))
    job = define(lambda: "survived", store_result=True)
    launch()
    assert wurk.result(job.perform_async(), timeout=15) == "survived"
    assert r.get("faults") == "7"
    wait_for(lambda: r.get("stat:processed") == "1")
    assert r.zcard("retry") == 0


def test_a_store_redis_refuses_is_logged_and_the_job_still_succeeds(
        config: Config, define: Define, launch: Launch, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tuned(config, redis_retry_base=0.01)
    monkeypatch.setattr(wire, "STORE", _failing_store(10**6, "WRONGTYPE injected"))
    job = define(lambda: "lost", store_result=True)
    after = define(lambda: "next")
    launch()
    job.perform_async()
    after.perform_async()
    wait_for(lambda: r.get("stat:processed") == "2")
    assert r.get("faults") == str(worker_results.OTHER_ATTEMPTS)
    assert r.zcard("retry") == 0 and r.llen("queue:default") == 0


def test_a_middleware_that_skips_the_job_stores_a_null_value(
        config: Config, define: Define, launch: Launch) -> None:
    config = tuned(config, server_middleware=[lambda job, queue, call_next: None])
    job = define(lambda: "never runs", store_result=True)
    launch()
    assert wurk.result(job.perform_async(), timeout=10) is None


def test_class_jobs_and_set_carry_the_option(config: Config, launch: Launch) -> None:
    class Square(wurk.Job, name="t_results_square", store_result=True, result_ttl=300):
        def perform(self, n: int) -> int:
            return n * n

    try:
        launch()
        assert wurk.result(Square.perform_async(9), timeout=10) == 81
        assert wurk.result(Square.set(result_ttl=5).perform_async(3), timeout=10) == 9
    finally:
        wurk.registry.discard("t_results_square")


def test_a_waiter_rides_out_a_redis_restart(own_redis: RedisServer) -> None:
    cfg = Config(redis_url=own_redis.url, redis_retry_base=0.05, redis_retry_cap=0.2,
                 log_level="warning")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(wurk.result("jr", timeout=20,
                                                                    config=cfg)))
    waiter.start()
    time.sleep(0.3)  # blocked in BRPOPLPUSH on the server about to go
    own_redis.stop()
    time.sleep(0.5)
    restarted = start_redis(port=own_redis.port)
    try:
        assert waiter.is_alive()
        record, final = wire.success_record({"jid": "jr", "class": "C"}, "after", time.time())
        with restarted.client() as c:
            c.eval(wire.STORE.source, 2, wire.key("jr"), wire.ready_key("jr"), record, 60,
                   "1" if final else "0")
        waiter.join(20)
        assert got == ["after"]
    finally:
        restarted.stop()
        close_runtime(cfg)  # its wait pool too


def test_more_waiters_than_wait_connections_all_get_it(
        config: Config, define: Define, launch: Launch) -> None:
    gate = threading.Event()
    job = define(lambda: gate.wait(20) and "all", store_result=True)
    launch()
    jid = job.perform_async()
    waiters = push_results.WAIT_CONNECTIONS + 36
    with ThreadPoolExecutor(waiters) as pool:
        futures = [pool.submit(wurk.result, jid, timeout=20) for _ in range(waiters)]
        time.sleep(0.5)
        gate.set()
        assert [f.result(20) for f in futures] == ["all"] * waiters

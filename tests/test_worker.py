"""Launcher, manager and processor end to end: real Redis, real threads, in process."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def stat(r: redis.Redis, name: str) -> int:
    return int(r.get(f"stat:{name}") or 0)


class Boom(RuntimeError):
    pass


def processor_threads_done(launcher: Launcher) -> bool:
    return all(not t.is_alive() for t in launcher.manager._threads)


# -- flow and stats ----------------------------------------------------------------------------


def test_jobs_flow_and_every_execution_is_counted(r: redis.Redis, define: Define,
                                                  launch: Launch) -> None:
    lock = threading.Lock()
    seen: list[Any] = []

    def work(value: int) -> None:
        with lock:
            seen.append(value)
        if value < 0:
            raise Boom(f"negative {value}")

    job = define(work, retry=False)
    for value in (1, 2, 3, -1, -2):
        job.perform_async(value)
    launcher = launch()
    wait_for(lambda: len(seen) == 5)
    # Flushed by the heartbeat, no stop needed.
    wait_for(lambda: stat(r, "processed") == 5 and stat(r, "failed") == 2)
    launcher.stop()
    assert sorted(seen) == [-2, -1, 1, 2, 3]
    assert stat(r, "processed") == 5
    assert stat(r, "failed") == 2
    assert int(r.get(f"stat:processed:{today()}") or 0) == 5
    assert int(r.get(f"stat:failed:{today()}") or 0) == 2
    assert 157_000_000 < r.ttl(f"stat:processed:{today()}") <= 157_680_000
    assert 157_000_000 < r.ttl(f"stat:failed:{today()}") <= 157_680_000
    assert r.llen("queue:default") == 0


def test_failing_job_retries_then_dies(r: redis.Redis, config: Config, define: Define,
                                       launch: Launch) -> None:
    config = tuned(config, queues=["fails"])
    runs: list[float] = []

    def always_fails(x: int) -> None:
        runs.append(time.time())
        raise Boom(f"failed with {x}")

    job = define(always_fails, retry=1, queue="fails")
    jid = job.perform_async(7)
    launcher = launch()
    entry_raw = wait_for(lambda: r.zrange("retry", 0, -1, withscores=True))
    assert len(runs) == 1
    (member, at), = entry_raw
    entry = json.loads(member)
    assert entry["jid"] == jid
    assert entry["class"] == job.name
    assert entry["args"] == [7]
    assert entry["queue"] == "fails"
    assert entry["retry"] == 1
    assert entry["error_class"] == "Boom"
    assert entry["error_message"] == "failed with 7"
    assert entry["retry_count"] == 0
    assert isinstance(entry["failed_at"], float)
    assert entry["failed_at"] + 15 <= at <= entry["failed_at"] + 25
    # Fast-forward the clock for the poller instead of waiting 15 s.
    launcher.poller.enqueue_due(now=time.time() + 3600)
    dead = wait_for(lambda: r.zrange("dead", 0, -1))
    final = json.loads(dead[0])
    assert final["jid"] == jid
    assert final["retry_count"] == 1
    assert final["failed_at"] == entry["failed_at"]
    assert isinstance(final["retried_at"], float)
    assert r.zcard("retry") == 0
    assert len(runs) == 2
    launcher.stop()
    assert stat(r, "processed") == 2
    assert stat(r, "failed") == 2


@pytest.fixture
def one_thread(config: Config) -> Config:
    return tuned(config, concurrency=1)


@pytest.mark.parametrize("raw", ["not json at all", '{"args": []}', "[1, 2]",
                                 '{"class": "X", "args": "not a list"}'])
def test_malformed_payload_goes_to_dead_raw(r: redis.Redis, one_thread: Config,
                                            define: Define, launch: Launch, raw: str) -> None:
    done = threading.Event()
    good = define(done.set)
    r.lpush("queue:default", raw)
    good.perform_async()  # behind the bad one
    launcher = launch()
    assert done.wait(EVENTUALLY), "the good job after a malformed one never ran"
    assert r.zrange("dead", 0, -1) == [raw]
    assert r.zcard("retry") == 0
    launcher.stop()
    assert stat(r, "failed") == 0
    assert stat(r, "processed") == 1


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "this.Zen"])
def test_unregistered_class_is_never_imported_or_called(r: redis.Redis, config: Config,
                                                        launch: Launch, tmp_path: Path,
                                                        name: str) -> None:
    marker = tmp_path / "pwned"
    args: list[Any] = {"os.system": [f"touch {marker}"],
                       "subprocess.Popen": [["touch", str(marker)]],
                       "this.Zen": []}[name]
    module = name.split(".")[0]
    was_loaded = module in sys.modules
    if name == "this.Zen":
        assert not was_loaded, "precondition: 'this' must not be imported yet"
    jid = new_jid()
    r.lpush("queue:default", json.dumps({"class": name, "args": args, "jid": jid,
                                         "queue": "default", "retry": True}))
    launch()
    member = wait_for(lambda: r.zrange("retry", 0, -1))[0]
    entry = json.loads(member)
    assert entry["jid"] == jid
    assert entry["error_class"] == "UnknownJobError"
    assert name in entry["error_message"]
    assert entry["retry_count"] == 0
    assert not marker.exists()
    assert (module in sys.modules) == was_loaded


# -- queue order and pausing ------------------------------------------------------------------


def test_strict_queue_order(r: redis.Redis, one_thread: Config, define: Define,
                            launch: Launch) -> None:
    tuned(one_thread, queues=["q1", "q2"])  # installed: launch() runs on it
    order: list[str] = []
    job = define(order.append)
    for i in range(3):
        job.set(queue="q2").perform_async(f"q2-{i}")
    for i in range(3):
        job.set(queue="q1").perform_async(f"q1-{i}")
    launch()
    wait_for(lambda: len(order) == 6)
    assert order == ["q1-0", "q1-1", "q1-2", "q2-0", "q2-1", "q2-2"]


def test_paused_queue_is_skipped_until_unpaused(r: redis.Redis, config: Config,
                                                define: Define, launch: Launch) -> None:
    config = tuned(config, queues=["held", "free"])
    ran: list[str] = []
    job = define(ran.append)
    r.sadd("paused", "held")
    job.set(queue="held").perform_async("held")
    job.set(queue="free").perform_async("free")
    launch()
    wait_for(lambda: "free" in ran)
    time.sleep(0.5)
    assert ran == ["free"]
    assert r.llen("queue:held") == 1
    r.srem("paused", "held")
    wait_for(lambda: "held" in ran)
    assert r.llen("queue:held") == 0


# -- hooks ----------------------------------------------------------------------------------


def test_server_middleware_wraps_jobs_in_order(r: redis.Redis, config: Config,
                                               define: Define, launch: Launch) -> None:
    events: list[str] = []
    lock = threading.Lock()

    def record(event: str) -> None:
        with lock:
            events.append(event)

    def outer(job: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        record(f"outer-in:{queue}:{job['args'][0]}")
        if job["args"][0] == "skip":
            return None
        result = call_next()
        record("outer-out")
        return result

    def inner(job: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        record("inner-in")
        result = call_next()
        record("inner-out")
        return result

    config.server_middleware.extend([outer, inner])
    config = tuned(config, concurrency=1)
    job = define(lambda arg: record(f"job:{arg}"))
    job.perform_async("run")
    job.perform_async("skip")
    launcher = launch()
    wait_for(lambda: len(events) == 6)
    launcher.stop()  # both jobs are over: nothing more can be recorded
    assert events == ["outer-in:default:run", "inner-in", "job:run", "inner-out", "outer-out",
                      "outer-in:default:skip"]
    # A skipped job counts as done, not failed.
    assert stat(r, "processed") == 2
    assert stat(r, "failed") == 0


def test_middleware_error_fails_the_job(r: redis.Redis, config: Config, define: Define,
                                        launch: Launch) -> None:
    def refuse(job: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        raise PermissionError("middleware says no")

    config.server_middleware.append(refuse)
    ran: list[int] = []
    job = define(ran.append, retry=0)
    job.perform_async(1)
    launch()
    dead = wait_for(lambda: r.zrange("dead", 0, -1))
    assert json.loads(dead[0])["error_class"] == "PermissionError"
    assert ran == []


def test_error_handlers_get_the_exception_and_context(r: redis.Redis, config: Config,
                                                      define: Define, launch: Launch) -> None:
    seen: list[tuple[BaseException, Mapping[str, Any]]] = []

    def broken(exc: BaseException, context: Mapping[str, Any]) -> None:
        raise RuntimeError("handler bug")

    config.error_handlers.extend([broken, lambda exc, ctx: seen.append((exc, ctx))])

    def fails() -> None:
        raise Boom("for the handlers")

    job = define(fails, retry=0, queue="errs")
    config = tuned(config, queues=["errs"])
    jid = job.perform_async()
    launch()
    wait_for(lambda: seen)
    exc, context = seen[0]
    assert isinstance(exc, Boom)
    assert str(exc) == "for the handlers"
    assert context["queue"] == "errs"
    assert context["job"]["jid"] == jid
    assert context["job"]["class"] == job.name
    # A broken handler does not stop the failure from being recorded.
    dead = wait_for(lambda: r.zrange("dead", 0, -1))
    assert json.loads(dead[0])["jid"] == jid


# -- shutdown -----------------------------------------------------------------------------------


@pytest.mark.parametrize("late_outcome", ["success", "failure"])
def test_stop_requeues_a_running_job_byte_for_byte(r: redis.Redis, one_thread: Config,
                                                   define: Define, launch: Launch,
                                                   late_outcome: str) -> None:
    tuned(one_thread, shutdown_timeout=0.5)  # installed: launch() runs on it
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    def long_job(tag: str) -> None:
        started.set()
        try:
            release.wait(30)  # far past the deadline, unless the test lets it go
            if late_outcome == "failure":
                raise Boom("late failure")
        finally:
            finished.set()

    job = define(long_job)
    # Hand-written JSON with odd spacing: any re-serialisation would show.
    raw = (f'{{"class":  "{job.name}", "args": [ "long" ], "jid": "{new_jid()}",'
           ' "queue": "default", "retry": true,  "bid": "keep-me", "created_at": 1700000000.5}')
    r.lpush("queue:default", raw)
    launcher = launch()
    try:
        assert started.wait(EVENTUALLY)
        newer = json.dumps({"class": job.name, "args": ["newer"], "jid": new_jid(),
                            "queue": "default", "retry": True})
        r.lpush("queue:default", newer)
        t0 = time.monotonic()
        requeued = launcher.stop()
        elapsed = time.monotonic() - t0
        assert requeued == 1
        # The job had its 0.5 s deadline; stop did not wait for its 30 s (five s
        # is ten times the deadline, room for a loaded machine).
        assert 0.4 <= elapsed < 5.0
        assert r.lrange("queue:default", 0, -1) == [newer, raw]
        assert launcher.identity not in r.smembers("processes")
        assert not r.exists(f"{launcher.identity}:work", f"{launcher.identity}:workers")
    finally:
        release.set()
    assert finished.wait(EVENTUALLY)
    wait_for(lambda: processor_threads_done(launcher))
    # The late outcome is dropped: no ack, no count, no retry entry.
    assert launcher.manager.counters.take() == (0, 0)
    assert r.zcard("retry") == 0
    assert r.zcard("dead") == 0
    assert stat(r, "processed") == 0
    assert stat(r, "failed") == 0
    assert r.lrange("queue:default", 0, -1) == [newer, raw]


def test_stop_lets_a_short_job_finish(r: redis.Redis, config: Config, define: Define,
                                      launch: Launch) -> None:
    config = tuned(config, shutdown_timeout=20.0)
    started = threading.Event()
    finished = threading.Event()

    def short_job() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    define(short_job).perform_async()
    launcher = launch()
    assert started.wait(EVENTUALLY)
    t0 = time.monotonic()
    assert launcher.stop() == 0
    # The job's 0.3 s, with room for a loaded machine, not the 20 s deadline.
    assert time.monotonic() - t0 < 5.0
    assert finished.is_set()
    assert r.llen("queue:default") == 0
    assert stat(r, "processed") == 1
    assert stat(r, "failed") == 0


def test_stop_waits_for_fetches_still_blocked_in_brpop(r: redis.Redis, config: Config,
                                                      define: Define, launch: Launch) -> None:
    # A deadline shorter than the fetch timeout: idle threads are still blocked
    # in BRPOP when the running job is pushed back, and one of them may pop it
    # and push it back, waking the next one: a ping-pong through every idle
    # thread. stop() must not return (and let the process exit) while such a
    # fetch is outstanding, or the job is lost with the process.
    config = tuned(config, concurrency=10, fetch_timeout=1.0, shutdown_timeout=0.2)
    started = threading.Event()
    release = threading.Event()
    runner: list[threading.Thread] = []

    def long_job() -> None:
        runner.append(threading.current_thread())
        started.set()
        release.wait(3)

    define(long_job).perform_async()
    raw = r.lindex("queue:default", -1)
    launcher = launch()
    try:
        assert started.wait(EVENTUALLY)
        # The fetch for the idle threads waits in Redis again (the fetch timeout
        # is longer than the deadline: it is still blocked when the job goes back).
        wait_for(lambda: r.info("clients")["blocked_clients"] >= 1, 10,
                 what="the idle threads' fetch blocked in Redis")
        t0 = time.monotonic()
        assert launcher.stop() == 1
        # The 0.2 s deadline and one 1 s fetch, with room for a loaded machine.
        assert time.monotonic() - t0 < 10.0
        idle = [t for t in launcher.manager._threads if t is not runner[0]]
        assert len(idle) == 9
        assert not any(t.is_alive() for t in idle)
        assert r.lrange("queue:default", 0, -1) == [raw]
    finally:
        release.set()
    wait_for(lambda: processor_threads_done(launcher))
    assert r.lrange("queue:default", 0, -1) == [raw]

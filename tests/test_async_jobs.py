"""``async def`` jobs in the threads executor (issue #17, step 1).

Real Launchers against the suite's redis-server; a real ``os.fork`` for the
per-process event loop, and a real ``wurk-swarm`` whose child is SIGKILLed
with async jobs in flight.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
import swarms
from cli_workers import Worker
from swarms import Launch, slot
from waiting import wait_for

import wurk
from wurk.cli import EX_OVERRAN
from wurk.push.job import JobFunction
from wurk.results.client import result as wurk_result
from wurk.runtime import event_loop
from wurk.runtime.launcher import Launcher
from wurk.runtime.middleware import current_job
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)
Define = Callable[..., JobFunction[..., Any]]
swarm_launch = swarms.launch
spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir


def test_the_registry_notes_coroutine_functions_and_perform_methods(define: Define) -> None:
    async def fetch(url: str) -> str:
        return url

    def plain() -> None:
        return None

    class Crawler(wurk.Job, name="t_async_crawler"):
        async def perform(self, url: str) -> None:
            return None

    try:
        assert wurk.registry.get(define(fetch).name).coroutine
        assert not wurk.registry.get(define(plain).name).coroutine
        assert wurk.registry.get("t_async_crawler").coroutine
    finally:
        wurk.registry.discard("t_async_crawler")


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A plain decorator: its wrapper is a sync function returning the coroutine."""
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)
    return wrapper


def ran_inline(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator that runs the coroutine itself and returns its value."""
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return asyncio.run(fn(*args))
    return wrapper


def test_decorated_coroutine_functions_run_as_async_jobs(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    seen: list[str] = []

    @logged
    async def wrapped(tag: str) -> None:
        await asyncio.sleep(0)
        seen.append(f"wrapped:{tag}")

    @ran_inline
    async def inline(tag: str) -> None:
        await asyncio.sleep(0)
        seen.append(f"inline:{tag}")

    for job in (define(wrapped), define(inline)):
        assert wurk.registry.get(job.name).coroutine
        job.perform_async("x")
    launch()
    wait_for(lambda: sorted(seen) == ["inline:x", "wrapped:x"], timeout=10)
    wait_for(lambda: r.get("stat:processed") == "2", timeout=5)
    assert r.zcard("retry") == 0


def test_an_async_job_function_is_still_its_coroutine_function(define: Define) -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    job = define(double)
    assert asyncio.run(job(21)) == 42


def test_waiting_on_the_loop_thread_itself_is_refused_not_a_hang() -> None:
    async def inner() -> int:
        return 1

    async def outer() -> str:
        try:
            event_loop.run(inner())
        except RuntimeError as exc:
            return str(exc)
        return "ran"

    assert "its own event loop thread" in event_loop.run(outer())


def test_async_functions_and_perform_methods_run_and_are_acknowledged(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    seen: list[tuple[str, Any]] = []

    async def greet(name: str) -> None:
        await asyncio.sleep(0.01)
        seen.append(("greet", name))

    class Crawl(wurk.Job, name="t_async_crawl"):
        async def perform(self, url: str) -> None:
            await asyncio.sleep(0.01)
            seen.append((self.jid, url))

    try:
        define(greet).perform_async("ada")
        jid = Crawl.perform_async("https://example.test/")
        launch()
        wait_for(lambda: len(seen) == 2, timeout=10)
        assert ("greet", "ada") in seen and (jid, "https://example.test/") in seen
        wait_for(lambda: r.get("stat:processed") == "2", timeout=5)
        assert r.llen("queue:default") == 0 and r.zcard("retry") == 0
    finally:
        wurk.registry.discard("t_async_crawl")


def test_an_async_jobs_return_value_is_its_stored_result(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    async def add(a: int, b: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"sum": a + b}

    jid = define(add, store_result=True).perform_async(2, 3)
    launch()
    assert wurk_result(str(jid), 10, config=config) == {"sum": 5}


def test_an_async_job_enqueues_with_the_awaitable_verbs_on_the_process_loop(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    seen: list[str] = []

    async def follow_up(tag: str) -> None:
        seen.append(tag)

    follow = define(follow_up)

    async def first() -> None:
        await follow.aperform_async("pushed-from-a-coroutine")

    define(first).perform_async()
    launch()
    wait_for(lambda: seen == ["pushed-from-a-coroutine"], timeout=10)
    assert r.zcard("retry") == 0


def test_a_failing_async_job_retries_and_then_dies(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        raise ValueError("no luck")

    async def doomed() -> None:
        raise KeyError("gone")

    define(broken).perform_async()
    define(doomed, retry=0).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1 and r.zcard("dead") == 1, timeout=10)
    retried = json.loads(r.zrange("retry", 0, -1)[0])
    assert (retried["error_class"], retried["error_message"]) == ("ValueError", "no luck")
    dead = json.loads(r.zrange("dead", 0, -1)[0])
    assert dead["error_class"] == "KeyError"
    wait_for(lambda: r.get("stat:failed") == "2", timeout=5)  # the heartbeat flushes it


def test_a_soft_limit_cancels_the_task_and_fails_with_job_timeout(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    marks: list[str] = []

    async def slow() -> None:
        marks.append("asleep")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            marks.append("cancelled")
            raise
        marks.append("woke")

    define(slow, timeout=0.3).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    failed = json.loads(r.zrange("retry", 0, -1)[0])
    assert failed["error_class"] == "JobTimeout"
    assert failed["error_message"] == "job ran past its timeout of 0.3s"
    assert marks == ["asleep", "cancelled"]
    assert event_loop.waiting_threads() == 0


def test_a_hard_limit_cancels_the_task_and_settles_a_timeout(
        config: Config, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    marks: list[str] = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            marks.append("cancelled")
            raise

    jid = define(stuck, hard_timeout=0.4).perform_async()
    asked: list[bool] = []
    launch_with(config, on_stop_request=lambda: asked.append(True))
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    failed = json.loads(r.zrange("retry", 0, -1)[0])
    assert (failed["jid"], failed["error_class"]) == (jid, "JobTimeout")
    assert failed["error_message"] == "job ran past its hard_timeout of 0.4s"
    wait_for(lambda: asked == [True] and marks == ["cancelled"], timeout=5)
    wait_for(lambda: event_loop.waiting_threads() == 0, timeout=5)


def test_a_stop_hands_back_running_async_jobs_and_cancels_their_tasks(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    marks: list[str] = []

    async def quick(tag: str) -> None:
        await asyncio.sleep(0)
        marks.append(f"done:{tag}")

    async def long(tag: str) -> None:
        marks.append(f"started:{tag}")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            marks.append(f"cancelled:{tag}")
            raise

    quick_job, long_job = define(quick), define(long)
    quick_job.perform_async("q")
    jids = {long_job.perform_async(f"l{i}") for i in range(3)}
    launcher = launch()  # the default concurrency (10): all four run at once
    wait_for(lambda: sum(m.startswith("started") for m in marks) == 3, timeout=10)
    assert "done:q" in marks
    requeued = launcher.stop(time.monotonic() + 0.5)
    assert requeued == 3
    wait_for(lambda: sum(m.startswith("cancelled") for m in marks) == 3, timeout=5)
    wait_for(lambda: event_loop.waiting_threads() == 0, timeout=5)
    back = {json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)}
    assert back == jids
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_server_middleware_wraps_async_jobs_like_sync_ones(
        redis_server: Any, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    order: list[str] = []

    def around(payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        order.append(f"before:{payload['args'][0]}")
        outcome = call_next()
        order.append(f"after:{payload['args'][0]}:{outcome}")
        return outcome

    async def async_job(tag: str) -> str:
        await asyncio.sleep(0)
        order.append(f"ran:{tag}")
        return tag.upper()

    def sync_job(tag: str) -> str:
        order.append(f"ran:{tag}")
        return tag.upper()

    config = Config(redis_url=redis_server.url, fetch_timeout=0.2, shutdown_timeout=2.0,
                    log_level="warning", concurrency=1, server_middleware=[around])
    wurk.configure(config)
    define(async_job).perform_async("a")
    define(sync_job).perform_async("s")
    launch_with(config)
    wait_for(lambda: len(order) == 6, timeout=10)
    for tag in ("a", "s"):
        assert order.index(f"before:{tag}") < order.index(f"ran:{tag}") < order.index(
            f"after:{tag}:{tag.upper()}")


def test_async_middleware_wraps_sync_and_async_jobs_keeping_sync_code_off_the_loop(
        redis_server: Any, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    order: list[str] = []
    threads_seen: dict[str, str] = {}

    async def outer(payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        tag = payload["args"][0]
        order.append(f"outer:{tag}")
        outcome = await call_next()
        order.append(f"outer-after:{tag}:{outcome}")
        return outcome

    def middle(payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        threads_seen[f"middle:{payload['args'][0]}"] = threading.current_thread().name
        return call_next()

    async def inner(payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        return await call_next()

    async def async_job(tag: str) -> str:
        await asyncio.sleep(0)
        threads_seen[tag] = threading.current_thread().name
        return tag.upper()

    def sync_job(tag: str) -> str:
        threads_seen[tag] = threading.current_thread().name
        return tag.upper()

    config = Config(redis_url=redis_server.url, fetch_timeout=0.2, shutdown_timeout=2.0,
                    log_level="warning", concurrency=2,
                    server_middleware=[outer, middle, inner])
    wurk.configure(config)
    define(async_job).perform_async("a")
    define(sync_job).perform_async("s")
    launch_with(config)
    wait_for(lambda: len(order) == 4, timeout=10)
    assert {"outer-after:a:A", "outer-after:s:S"} <= set(order)
    assert threads_seen["a"] == "wurk-asyncio"
    for name in ("s", "middle:a", "middle:s"):
        assert threads_seen[name].startswith("wurk-processor"), threads_seen
    wait_for(lambda: r.get("stat:processed") == "2", timeout=5)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_soft_limit_under_an_async_middleware_fails_the_job(
        redis_server: Any, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher], kind: str) -> None:
    async def passing(payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        return await call_next()

    def spin() -> None:
        while True:
            pass

    async def hang() -> None:
        await asyncio.sleep(30)

    config = Config(redis_url=redis_server.url, fetch_timeout=0.2, shutdown_timeout=2.0,
                    log_level="warning", concurrency=1, server_middleware=[passing])
    wurk.configure(config)
    define(spin if kind == "sync" else hang, timeout=0.3).perform_async()
    launch_with(config)
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    failed = json.loads(r.zrange("retry", 0, -1)[0])
    assert failed["error_class"] == "JobTimeout"
    assert event_loop.waiting_threads() == 0


def test_system_exit_in_an_async_job_fails_it_and_the_loop_lives_on(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    ran: list[str] = []

    async def quitter() -> None:
        raise SystemExit(3)

    async def after() -> None:
        ran.append("after")

    define(quitter).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    assert json.loads(r.zrange("retry", 0, -1)[0])["error_class"] == "SystemExit"
    define(after).perform_async()
    wait_for(lambda: ran == ["after"], timeout=10)


def test_a_job_that_stops_the_loop_fails_and_the_next_one_gets_a_new_loop(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    ran: list[str] = []

    async def vandal() -> None:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(5)

    async def after() -> None:
        ran.append("after")

    define(vandal).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    assert json.loads(r.zrange("retry", 0, -1)[0])["error_class"] == "CancelledError"
    define(after).perform_async()
    wait_for(lambda: ran == ["after"], timeout=10)
    assert event_loop.waiting_threads() == 0


TAG: contextvars.ContextVar[str] = contextvars.ContextVar("TAG", default="unset")


def test_concurrent_async_jobs_keep_their_own_contextvars(
        redis_server: Any, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    clashes: list[tuple[str, str]] = []
    done: list[str] = []

    async def tagged(tag: str) -> None:
        assert TAG.get() == "unset"  # nothing left over from another job
        TAG.set(tag)
        await asyncio.sleep(0.05)  # every job is parked here at once
        current = current_job()
        if TAG.get() != tag or current is None or current["args"] != [tag]:
            clashes.append((tag, TAG.get()))
        done.append(tag)

    config = Config(redis_url=redis_server.url, fetch_timeout=0.2, shutdown_timeout=2.0,
                    log_level="warning", concurrency=8)
    wurk.configure(config)
    job = define(tagged)
    job.perform_bulk([[f"t{i}"] for i in range(40)])
    launch_with(config)
    wait_for(lambda: len(done) == 40, timeout=20)
    assert clashes == [] and sorted(done) == sorted(f"t{i}" for i in range(40))
    assert r.zcard("retry") == 0


def test_a_forked_child_runs_async_jobs_on_its_own_loop(
        config: Config, r: redis.Redis, define: Define) -> None:
    async def whose() -> tuple[int, int]:
        await asyncio.sleep(0)
        return os.getpid(), threading.get_native_id()

    parent_pid, parent_loop_thread = event_loop.run(whose())
    assert parent_pid == os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            child_pid, child_loop_thread = event_loop.run(whose())
            report = {"pid_ok": child_pid == os.getpid(),
                      "new_thread": child_loop_thread != parent_loop_thread}
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    report = json.loads(os.read(read_end, 4096))
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == {"pid_ok": True, "new_thread": True}


ASYNC_CLI_JOBS = textwrap.dedent("""
    import asyncio
    import os

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job(name="a_quick")
    async def quick(tag):
        await asyncio.sleep(0.01)
        _r.rpush("a:done", tag)


    @wurk.job(name="a_long")
    async def long(tag):
        _r.rpush("a:started", tag)
        try:
            await asyncio.sleep(30)
        finally:
            _r.rpush("a:unwound", tag)


    @wurk.job(name="a_stuck", hard_timeout=0.5)
    async def stuck():
        _r.rpush("a:started", "stuck")
        while True:  # sync code in a coroutine: never reaches an await
            pass
""")


def test_wurk_run_stops_with_async_jobs_running_and_loses_none(
        r: redis.Redis, spawn: Callable[..., Worker], jobs_dir: Path) -> None:
    (jobs_dir / "async_cli_jobs.py").write_text(ASYNC_CLI_JOBS, encoding="utf-8")
    worker = spawn("-r", "async_cli_jobs", "-c", "6", "-t", "1")
    quick = [cli_workers.push(r, "a_quick", f"q{i}")[0] for i in range(4)]
    long = {cli_workers.push(r, "a_long", f"l{i}")[0] for i in range(2)}
    wait_for(lambda: r.llen("a:done") == 4 and r.llen("a:started") == 2, timeout=20)
    worker.send(signal.SIGTERM)
    assert worker.wait(20) == 0
    back = {json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)}
    assert back == long and len(quick) == 4
    assert sorted(r.lrange("a:unwound", 0, -1)) == ["l0", "l1"]  # cancelled, not abandoned
    for noise in ("Task was destroyed", "was never awaited", "Exception ignored"):
        assert noise not in worker.stderr()
    fails = [e for e in worker.events() if e.get("event") == "job.fail"]
    assert len(fails) == 2 and all(e["error"].startswith("HandedBack") for e in fails), fails


def test_wurk_run_settles_a_coroutine_stuck_in_sync_code_past_its_hard_limit(
        r: redis.Redis, spawn: Callable[..., Worker], jobs_dir: Path) -> None:
    (jobs_dir / "async_cli_jobs.py").write_text(ASYNC_CLI_JOBS, encoding="utf-8")
    worker = spawn("-r", "async_cli_jobs", "-t", "1")
    jid, _ = cli_workers.push(r, "a_stuck")
    assert worker.wait(30) == EX_OVERRAN
    [raw] = r.zrange("retry", 0, -1)
    failed = json.loads(raw)
    assert (failed["jid"], failed["error_class"]) == (jid, "JobTimeout")


ASYNC_SWARM_JOBS = textwrap.dedent("""
    import asyncio
    import os

    import redis

    import wurk


    @wurk.job(name="nap")
    async def nap(tag, seconds):
        redis.Redis.from_url(os.environ["TEST_REDIS_URL"]).rpush("started", tag)
        await asyncio.sleep(seconds)
        redis.Redis.from_url(os.environ["TEST_REDIS_URL"]).rpush("done", tag)
""")


def test_a_killed_swarm_child_loses_no_async_job(
        swarm_launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    (tmp_path / "async_swarm_jobs.py").write_text(ASYNC_SWARM_JOBS, encoding="utf-8")
    tags = [f"n{i}" for i in range(20)]
    for tag in tags:
        swarms.push(r, "naps", "nap", tag, 1.5)
    swarm = swarm_launch(slot("naps", concurrency=10, queues=["naps"]), layout={"naps": 1},
                         require=["swarm_jobs", "async_swarm_jobs"], reliable_fetch=True)
    victim = swarm.wait_ready()[("naps", 0)]["pid"]
    wait_for(lambda: r.llen("started") >= 10, timeout=15)
    os.kill(victim, signal.SIGKILL)
    swarm.wait_ready(not_pids={victim})
    wait_for(lambda: set(r.lrange("done", 0, -1)) == set(tags), timeout=40)
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

"""A processor thread's wait on an ``async def`` job: time limits, stops, a dead loop.

The wait must never leave a JobTimeout pending in a thread (CPython 3.11
then keeps every thread on its slow path: cProfile'd code crawls), never
hang on a loop that closed under it, and a stop cancels only the
coroutines of the Launcher that stopped. Real Launchers against the
suite's redis-server; the interpreter-wide checks run in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from profiled_speed import assert_profiled_code_runs_after
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.runtime import event_loop
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)
Define = Callable[..., JobFunction[..., Any]]

RACED_THEN_PROFILED = """
import asyncio, threading
from wurk.runtime import event_loop
from wurk.runtime.job_timer import JobTimer, raise_in, timeout_type
from wurk.runtime.time_limits import Limits
from wurk.runtime.work import UnitOfWork

cancelled = []

async def sleepy():
    try:
        await asyncio.sleep(20)
    except asyncio.CancelledError:
        cancelled.append(1)
        raise

# 1. The timer's own path: the task is cancelled, nothing is raised in the thread.
timer = JobTimer(None, None)
work = UnitOfWork("default", b"{}")
outcome = timer.run("slot", work, {"jid": "j"}, None, limits=Limits(timeout=0.05),
                    call=lambda: event_loop.run(sleepy()))
assert type(outcome).__name__ == "JobTimeout", outcome
timer.stop()

# 2. The race: a JobTimeout raised in a thread (it ran sync code an instant
# before) that is now blocked waiting on a coroutine 20 s long.
caught = []

def wait():
    try:
        event_loop.run(sleepy())
    except BaseException as exc:
        caught.append(type(exc).__name__)

waiter = threading.Thread(target=wait)
waiter.start()
while event_loop.waiting_threads() == 0:
    threading.Event().wait(0.01)
raise_in(waiter.ident, timeout_type("raced", 1.0, False))
waiter.join(10)
assert not waiter.is_alive() and caught == ["JobTimeout"], caught
while len(cancelled) < 2:
    threading.Event().wait(0.01)

"""


def test_a_timeout_raised_in_a_waiting_thread_lands_and_leaves_nothing_pending(
        tmp_path: Path) -> None:
    """A JobTimeout the timer raised in a thread an instant before it began to
    wait on a coroutine is taken at once (the coroutine cancelled), not held
    pending until the coroutine ends; afterwards profiled code runs at full
    speed (a pending async exception makes 300,000 profiled calls take minutes)."""
    assert_profiled_code_runs_after(RACED_THEN_PROFILED, tmp_path, timeout=45)


def test_a_wait_on_a_loop_closed_without_waking_it_ends() -> None:
    """The wait began as the loop stopped (after its waiters were woken): it ends
    with a clear error instead of blocking its thread for good."""
    closed = asyncio.new_event_loop()
    closed.close()
    waiting = event_loop._Waiting(queue.SimpleQueue())
    assert event_loop._next(waiting, closed) is waiting
    with pytest.raises(RuntimeError, match="event loop stopped"):
        event_loop._outcome(waiting)


def test_a_stop_cancels_only_the_coroutines_of_its_own_launcher(
        redis_server: Any, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    marks: list[str] = []
    release = threading.Event()

    async def held(tag: str) -> None:
        marks.append(f"started:{tag}")
        try:
            while not release.is_set():
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            marks.append(f"cancelled:{tag}")
            raise
        marks.append(f"done:{tag}")

    def config_for(queue_name: str) -> Config:
        return Config(redis_url=redis_server.url, fetch_timeout=0.2, shutdown_timeout=2.0,
                      log_level="warning", concurrency=2, queues=[queue_name])

    wurk.configure(config_for("staying"))
    job = define(held)
    job.set(queue="staying").perform_async("stay")
    back = job.set(queue="leaving").perform_async("leave")
    launch_with(config_for("staying"))
    leaving = launch_with(config_for("leaving"))
    wait_for(lambda: {"started:stay", "started:leave"} <= set(marks), timeout=10)
    assert leaving.stop(time.monotonic() + 0.3) == 1
    wait_for(lambda: "cancelled:leave" in marks, timeout=5)
    assert [json.loads(raw)["jid"] for raw in r.lrange("queue:leaving", 0, -1)] == [back]
    release.set()
    wait_for(lambda: "done:stay" in marks, timeout=5)
    assert "cancelled:stay" not in marks
    wait_for(lambda: r.llen("queue:staying") == 0 and event_loop.waiting_threads() == 0, timeout=5)
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_a_task_that_cannot_be_created_fails_the_wait_instead_of_hanging() -> None:
    def refuse(_loop: asyncio.AbstractEventLoop, _coro: Any) -> asyncio.Task[Any]:
        raise ValueError("no tasks today")

    async def never() -> None:
        raise AssertionError("not run")

    target = event_loop.loop()
    target.set_task_factory(refuse)
    try:
        with pytest.raises(ValueError, match="no tasks today"):
            event_loop.run(never())
    finally:
        target.set_task_factory(None)
    assert event_loop.waiting_threads() == 0


def test_a_stop_cancels_a_coroutine_that_swallowed_its_soft_limit(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    marks: list[str] = []

    async def stubborn() -> None:
        marks.append("started")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            marks.append("shrugged")  # the soft limit's cancellation, ignored
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            marks.append("stopped")
            raise

    jid = define(stubborn, timeout=0.2).perform_async()
    launcher = launch()
    wait_for(lambda: marks == ["started", "shrugged"], timeout=10)
    assert launcher.stop(time.monotonic() + 0.3) == 1
    wait_for(lambda: marks == ["started", "shrugged", "stopped"], timeout=5)
    wait_for(lambda: event_loop.waiting_threads() == 0, timeout=5)
    assert [json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)] == [jid]

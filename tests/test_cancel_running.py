"""Cancelling a running job from another client (wurk.api.cancel): the process
running it reads the marker from Redis and stops it, on a thread (JobCancelled
at its next bytecode) and on the event loop (its task cancelled). It goes to
neither retry nor dead, is logged once as job.cancelled, releases its unique
lock, and its result waiter is told. Real redis-server, real launchers, and one
real ``wurk run`` process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import cli_workers
import pytest
import redis
from cli_workers import Worker
from starlette.testclient import TestClient
from structlog.testing import capture_logs
from waiting import wait_for

import wurk
import wurk.web
from wurk.api import cancel
from wurk.push.client import Client
from wurk.results.client import wait
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire import keys

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir


def push(config: Config, name: str) -> str:
    jid = Client(config).push({"class": name, "args": [1], "unique_for": 3600,
                               "result_ttl": 60})
    assert jid is not None
    return jid


def visible(config: Config, jid: str) -> None:
    """Running, as the process's heartbeat shows it (what cancel looks for)."""
    wait_for(lambda: any(w.payload.get("jid") == jid for _, _, w in wurk.api.Workers(
        config=config)), what="the job in its process's work")


def cancelled_cleanly(config: Config, r: redis.Redis, name: str, jid: str,
                      logs: list[dict[str, Any]]) -> None:
    outcome = wait(jid, 30, config=config)
    assert (outcome.status, outcome.error_class, outcome.final) == (
        "failed", "JobCancelled", True)
    wait_for(lambda: [e for e in logs if e["event"] == "job.cancelled"], what="job.cancelled")
    assert not r.exists(lock_key(name, "default", [1]))
    assert r.zcard(keys.RETRY) == 0 and r.zcard(keys.DEAD) == 0
    assert r.llen("queue:default") == 0
    assert [e["jid"] for e in logs if e["event"] == "job.cancelled"] == [jid]
    assert not [e for e in logs if e["event"] in ("job.fail", "job.retry", "job.dead")]


def sleeper_until_cancelled(started: threading.Event) -> Callable[[int], None]:
    """A job that sets ``started`` and sleeps a minute, one short C call at a time."""
    def sleeper(n: int) -> None:
        started.set()
        for _ in range(1200):
            time.sleep(0.05)
    return sleeper


def test_a_sleeping_thread_job_is_cancelled_from_another_client(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch: Callable[..., Launcher]) -> None:
    started, saw = threading.Event(), []

    def sleeper(n: int) -> None:
        started.set()
        try:
            for _ in range(1200):  # a minute, one short C call at a time
                time.sleep(0.05)
        except wurk.JobCancelled:
            saw.append(wurk.cancelled())
            raise
        r.rpush("finished", n)

    job = define(sleeper)
    launch()
    with capture_logs() as logs:
        jid = push(config, job.name)
        assert started.wait(20)
        visible(config, jid)
        assert cancel(jid, config=config).state == "running"
        cancelled_cleanly(config, r, job.name, jid, logs)
    assert saw == [True] and r.llen("finished") == 0


def test_an_async_job_is_cancelled_on_the_event_loop(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    started, saw = threading.Event(), []

    async def sleeper(n: int) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw.append(wurk.cancelled())
            raise
        r.rpush("finished", n)

    job = define(sleeper)
    launch_with(dataclasses.replace(config, executor="asyncio"))
    with capture_logs() as logs:
        jid = push(config, job.name)
        assert started.wait(20)
        visible(config, jid)
        cancel(jid, config=config)
        cancelled_cleanly(config, r, job.name, jid, logs)
    assert saw == [True] and r.llen("finished") == 0


def test_a_class_job_sees_self_cancelled(config: Config, r: redis.Redis,
                                         launch: Callable[..., Launcher]) -> None:
    class Careful(wurk.Job, name="test_cancel_careful"):
        def perform(self, n: int) -> None:
            assert not self.cancelled
            r.rpush("started", n)
            try:
                while True:
                    time.sleep(0.05)
            finally:
                r.rpush("saw", str(self.cancelled))

    try:
        launch()
        jid = push(config, Careful.wurk_name)
        wait_for(lambda: r.llen("started"), what="the job started")
        visible(config, jid)
        cancel(jid, config=config)
        wait_for(lambda: r.lrange("saw", 0, -1), what="the job unwound")
        assert r.lrange("saw", 0, -1) == ["True"]
    finally:
        wurk.registry.discard(Careful.wurk_name)
    assert not wurk.cancelled() and not Careful().cancelled  # outside any run


@pytest.mark.timeout(120)
def test_a_real_wurk_run_process_stops_a_cancelled_job(
        config: Config, r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "clijobs", "--log-level", "info")
    jid, _ = cli_workers.push(r, "cli_loop", 1)
    wait_for(lambda: r.llen("cli:started"), 60, what="the job started")
    visible(config, jid)
    assert cancel(jid, config=config).state == "running"

    def said() -> list[dict[str, Any]]:
        return [e for e in worker.events() if e.get("event") == "job.cancelled"]

    [line] = wait_for(said, 30, what="job.cancelled in the worker's log")
    assert line["jid"] == jid
    assert r.zcard(keys.RETRY) == 0 and r.zcard(keys.DEAD) == 0
    assert worker.alive()


def test_kill_settles_a_job_stuck_in_c_and_recycles_its_process(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch_with: Callable[..., Launcher]) -> None:
    release = threading.Event()

    def stuck(n: int) -> None:
        r.rpush("started", n)
        release.wait(120)  # one C-level wait: no exception lands inside it

    job = define(stuck)
    launcher = launch_with(dataclasses.replace(config, shutdown_timeout=1.0))
    try:
        with capture_logs() as logs:
            jid = push(config, job.name)
            wait_for(lambda: r.llen("started"), what="the job started")
            visible(config, jid)
            cancel(jid, kill=True, config=config)
            cancelled_cleanly(config, r, job.name, jid, logs)
            wait_for(launcher.stopped.is_set, 30, what="the process recycled")
        assert launcher.overran.is_set()
        assert [e["reason"] for e in logs if e["event"] == "launcher.recycling"] == [
            "cancel_kill"]
        assert r.llen("queue:default") == 0  # settled, so not handed back by the stop
    finally:
        release.set()


def test_a_cancelled_running_batch_job_counts_as_a_death(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch: Callable[..., Launcher]) -> None:
    started = threading.Event()

    def noop(*args: Any) -> None:
        return None

    job, callback = define(sleeper_until_cancelled(started)), define(noop)
    with wurk.Batch("cancels", on_complete=(callback, []), on_success=(callback, [])) as b:
        jid = b.add(job, 1)
    launch()
    assert started.wait(20)
    visible(config, jid)
    cancel(jid, config=config)
    wait_for(lambda: r.exists(f"b-{b.bid}-death"), what="the batch's death")
    assert r.scard(f"b-{b.bid}-died") == 1 and r.exists(f"b-{b.bid}-complete")
    assert not r.exists(f"b-{b.bid}-success")
    assert json.loads(r.hget(f"b-{b.bid}-failinfo", jid))["class"] == "JobCancelled"
    assert r.zcard(keys.RETRY) == 0 and r.zcard(keys.DEAD) == 0


def test_the_busy_page_cancels_a_running_job(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch: Callable[..., Launcher]) -> None:
    started = threading.Event()
    job = define(sleeper_until_cancelled(started))
    launch()
    with TestClient(wurk.web.app(config)) as web, capture_logs() as logs:
        jid = push(config, job.name)
        assert started.wait(20)
        visible(config, jid)
        page = web.get("/busy").text
        assert f'<input type="hidden" name="jid" value="{jid}">' in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        done = web.post("/busy/cancel", data={"csrf": csrf.group(1), "jid": jid})
        assert done.status_code == 200 and "Cancel sent" in done.text
        cancelled_cleanly(config, r, job.name, jid, logs)
        gone = web.post("/busy/cancel", data={"csrf": csrf.group(1), "jid": "f" * 24})
        assert gone.status_code == 404


def test_a_served_marker_is_gone_so_a_job_pushed_again_with_its_jid_runs(
        config: Config, r: redis.Redis, define: Callable[..., Any],
        launch: Callable[..., Launcher]) -> None:
    started = threading.Event()

    def once_stuck(n: int) -> None:
        if n == 1:
            started.set()
            for _ in range(1200):  # a minute, one short C call at a time
                time.sleep(0.05)
        r.rpush("finished", n)

    job = define(once_stuck)
    launch()
    client = Client(config)
    with capture_logs() as logs:
        jid = client.push({"class": job.name, "args": [1]})
        assert jid is not None and started.wait(20)
        visible(config, jid)
        assert cancel(jid, config=config).state == "running"
        wait_for(lambda: [e for e in logs if e["event"] == "job.cancelled"], what="job.cancelled")
        wait_for(lambda: not r.exists(keys.cancel(jid)), what="the served marker deleted")
        # An application that names its own jobs pushes the same jid again.
        assert client.push({"class": job.name, "args": [2], "jid": jid}) == jid
        wait_for(lambda: r.lrange("finished", 0, -1) == ["2"], what="the new job done")
    assert [e["jid"] for e in logs if e["event"] == "job.cancelled"] == [jid]

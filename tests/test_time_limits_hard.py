"""Hard time limits (``hard_timeout``): in a Launcher, in a real swarm, in ``wurk run``.

Real processes and the suite's redis-server throughout: a swarm child whose
job overruns settles it as a JobTimeout failure and recycles itself, a
child wedged in C code holding the GIL is KILLed by its parent (which then
settles the job the same way), and ``wurk run`` stops with status 75. The
parent's reading of the child's notes is tested in process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
import swarms
from cli_workers import Worker
from structlog.testing import capture_logs
from swarms import Launch, slot
from waiting import wait_for

from supervisor import overrun
from supervisor.children import Child
from supervisor.topology import parse
from wurk.cli import EX_OVERRAN
from wurk.push.job import JobFunction
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.results.client import peek
from wurk.runtime.embedded import Embedded
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

pytestmark = pytest.mark.timeout(90)
launch = swarms.launch
jobs_dir = cli_workers.jobs_dir
spawn = cli_workers.spawn
Define = Callable[..., JobFunction[..., Any]]

LIMIT_JOBS = textwrap.dedent("""
    import re
    import time

    import wurk
    from swarm_jobs import r


    @wurk.job(name="nap")
    def nap(seconds):
        r().rpush("napping", "1")
        time.sleep(seconds)
        r().rpush("woke", "1")


    @wurk.job(name="wedge")
    def wedge():
        r().rpush("wedged", "1")
        # Catastrophic backtracking: the regex engine is C code that never
        # lets go of the GIL, so no other thread of this process runs.
        re.match(r"(a+)+$", "a" * 64 + "b")
""")


def push_raw(r: redis.Redis, cls: str, *args: Any, queue: str = "default",
             **fields: Any) -> str:
    jid = new_jid()
    now = time.time()
    payload = {"class": cls, "args": list(args), "queue": queue, "jid": jid, "retry": True,
               "created_at": now, "enqueued_at": now, **fields}
    r.sadd("queues", queue)
    r.lpush(f"queue:{queue}", json.dumps(payload))
    return jid


def retried(r: redis.Redis, jid: str) -> dict[str, Any] | None:
    for member in r.zrange("retry", 0, -1):
        job: dict[str, Any] = json.loads(member)
        if job["jid"] == jid:
            return job
    return None


@pytest.fixture
def limit_jobs(tmp_path: Path) -> Iterator[None]:
    (tmp_path / "limit_jobs.py").write_text(LIMIT_JOBS, encoding="utf-8")
    yield


# -- in one process ------------------------------------------------------------
def test_a_launcher_settles_an_overrun_as_a_timeout_and_recycles(
        config: Config, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    finished: list[str] = []

    def spin() -> None:
        while True:
            pass

    def short() -> None:
        time.sleep(0.8)
        finished.append("short")

    spinner = define(spin, hard_timeout=0.4)
    define(short).perform_async()
    jid = spinner.perform_async()
    asked: list[bool] = []
    launcher = launch_with(config, on_stop_request=lambda: asked.append(True))
    wait_for(lambda: retried(r, str(jid)) is not None, timeout=10)
    failed = retried(r, str(jid))
    assert failed is not None and failed["error_class"] == "JobTimeout"
    assert failed["error_message"] == "job ran past its hard_timeout of 0.4s"
    wait_for(lambda: asked == [True], timeout=5)
    assert launcher.overran.is_set()
    # The spinner unwound (its late outcome dropped); the other job was untouched.
    wait_for(lambda: finished == ["short"] and launcher.manager.in_flight.busy() == 0,
             timeout=5)
    assert r.zcard("retry") == 1 and r.zcard("dead") == 0


def test_an_overrun_logs_one_outcome_for_its_one_run(
        config: Config, r: redis.Redis, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    def spin() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass

    jid = str(define(spin, hard_timeout=0.3).perform_async())
    with capture_logs() as logs:
        launcher = launch_with(config, on_stop_request=lambda: None)
        wait_for(lambda: retried(r, jid) is not None, timeout=10)
        # The spinner's thread unwinds after the settle: wait for that too.
        wait_for(lambda: any(e["event"] == "job.unwound" for e in logs), timeout=10)
        # Each line is said just after what it reports (the retry entry, the unwound
        # run), so the test waits for the lines and the freed slot themselves.
        wait_for(lambda: any(e["event"] == "job.retry" for e in logs), timeout=10)
        wait_for(lambda: launcher.manager.in_flight.busy() == 0, timeout=10)
    mine = [e["event"] for e in logs if e.get("jid") == jid and e["event"] != "job.start"]
    # Before: job.hard_timeout, job.retry, and a job.fail when the thread returned.
    # The settle runs beside the unwinding thread: the order of the last two varies.
    assert mine[0] == "job.hard_timeout"
    assert sorted(mine[1:]) == ["job.retry", "job.unwound"]


def test_an_embedded_worker_settles_an_overrun_and_carries_on(
        config: Config, r: redis.Redis, define: Define) -> None:
    seen: list[BaseException] = []
    observed = dataclasses.replace(config, error_handlers=[lambda exc, _ctx: seen.append(exc)])
    runs: list[int] = []

    def spin() -> None:
        while True:
            pass

    jid = define(spin, hard_timeout=0.3, store_result=True).perform_async()
    embedded = Embedded(observed).start()
    try:
        wait_for(lambda: retried(r, str(jid)) is not None, timeout=10)
        # A result waiter reads the overrun as an error a retry will follow.
        wait_for(lambda: peek(str(jid), config=observed) is not None, timeout=5)
        outcome = peek(str(jid), config=observed)
        assert outcome is not None and not outcome.final
        assert outcome.error_class == "JobTimeout"
        define(lambda: runs.append(1)).perform_async()
        wait_for(lambda: runs == [1], timeout=10)
        assert embedded.launcher is not None and not embedded.launcher.stopped.is_set()
        assert [type(e).__name__ for e in seen] == ["JobTimeout"]
    finally:
        embedded.stop()


# -- the parent's notes ----------------------------------------------------------
def a_child(tmp_path: Path) -> Child:
    document = {"wurk": {"reliable_fetch": False}, "slot": [{"name": "a"}]}
    return Child(parse(document, tmp_path / "t.toml").slots[0], 0, 1, None)


def test_the_parent_reads_notes_and_ignores_garbage(tmp_path: Path) -> None:
    child = a_child(tmp_path)
    overrun.absorb(child, b'..host:1:ab\n.+["j1", "q", 10.5]\n..+["j2", "q", 11]\n')
    assert child.deadlines == {"j1": ("q", 10.5), "j2": ("q", 11.0)}
    overrun.absorb(child, b'-["j1"]\n+[1, "q", 3]\n+["j3", "q", "soon"]\n+["j4", "q", NaN]\n'
                          b'+{"a": 1}\n-[]\n+not json\n+["j5"]\n' + b"+" + b"x" * 5000 + b"\n"
                          b'+["j6", "q", true]\n+["j7", "q", 1' + b"0" * 400 + b"]\n")
    assert child.deadlines == {"j2": ("q", 11.0)}
    assert overrun.overran([child], 11 + overrun.GRACE - 0.1) == []
    assert overrun.overran([child], 11 + overrun.GRACE) == [child]
    assert child.overran == {"j2": "q"}


def test_a_lost_end_note_kills_no_healthy_child_and_a_settle_runs_once(
        tmp_path: Path, r: redis.Redis, redis_server: Any) -> None:
    document = {"wurk": {"redis_url": redis_server.url}, "slot": [{"name": "a"}]}
    child = Child(parse(document, tmp_path / "t.toml").slots[0], 0, 1, None,
                  identity="host:1:abc")
    config = child.slot.config
    held = json.dumps({"class": "nap", "args": [1], "jid": "held1", "queue": "q",
                       "retry": True, "created_at": time.time()})
    r.lpush("wurk:wip:host:1:abc:q", held)
    child.deadlines = {"held1": ("q", 0.0), "ended1": ("q", 0.0)}
    # "ended1" is in no private list: its "-" note was lost, so it is forgotten.
    try:
        assert overrun.overran([child], 100.0) == [child]
    finally:
        close_runtime(config)
    assert child.overran == {"held1": "q"} and "ended1" not in child.deadlines
    try:
        overrun.settle_overran(runtime_for(config), "host:1:abc", child.overran)
        overrun.settle_overran(runtime_for(config), "host:1:abc", child.overran)
    finally:
        close_runtime(config)
    assert r.llen("wurk:wip:host:1:abc:q") == 0
    [entry] = [json.loads(m) for m in r.zrange("retry", 0, -1)]
    assert (entry["jid"], entry["error_class"], entry["retry_count"]) == ("held1", "JobTimeout", 0)


# -- a real swarm ----------------------------------------------------------------
SWARM = {"require": ["swarm_jobs", "limit_jobs"], "shutdown_timeout": 1}


def test_a_swarm_child_settles_its_overrun_and_is_replaced(
        launch: Launch, limit_jobs: None, r: redis.Redis) -> None:
    swarm = launch(slot("w", concurrency=2, queues=["qh"]), layout={"w": 1}, **SWARM)
    first = swarm.wait_ready()[("w", 0)]["pid"]
    other = swarms.push(r, "qh", "slow_incr", "k", 3)
    wait_for(lambda: r.llen("started") == 1, timeout=10)
    jid = push_raw(r, "nap", 30, queue="qh", hard_timeout=1)
    wait_for(lambda: retried(r, jid) is not None, timeout=15)
    failed = retried(r, jid)
    assert failed is not None and failed["error_class"] == "JobTimeout"
    swarm.wait_ready(not_pids={first}, timeout=20)
    # The other job was handed back by the recycle's stop and ran once, to its end.
    wait_for(lambda: r.get("k") == "1", timeout=20)
    time.sleep(0.5)
    assert r.get("k") == "1" and r.llen("woke") == 0
    assert swarm.events("shutdown.requeued") and not swarm.events("child.overran")
    assert r.zcard("dead") == 0 and r.zcard("wurk:suspects") == 0
    assert not r.exists(f"wurk:pill:{other}")


def test_a_wedged_child_is_killed_and_its_job_is_a_timeout_failure(
        launch: Launch, limit_jobs: None, r: redis.Redis) -> None:
    swarm = launch(slot("w", concurrency=2, queues=["qw"], child_timeout=60),
                   layout={"w": 1}, **SWARM)
    first = swarm.wait_ready()[("w", 0)]["pid"]
    other = swarms.push(r, "qw", "slow_incr", "k", 2)
    wait_for(lambda: r.llen("started") == 1, timeout=10)
    jid = push_raw(r, "wedge", queue="qw", hard_timeout=1)
    wait_for(lambda: r.llen("wedged") == 1, timeout=10)
    [event] = swarm.wait_events("child.overran", timeout=20)
    assert event["jids"] == [jid]
    wait_for(lambda: retried(r, jid) is not None, timeout=10)
    failed = retried(r, jid)
    assert failed is not None and failed["error_class"] == "JobTimeout"
    assert "KILLed" in failed["error_message"]
    swarm.wait_ready(not_pids={first}, timeout=20)
    # Held by the wedged child too: given back unblamed, and run once.
    wait_for(lambda: r.get("k") == "1", timeout=20)
    assert r.zcard("wurk:suspects") == 0 and not r.exists(f"wurk:pill:{other}")
    assert r.zcard("dead") == 0 and r.zcard("retry") == 1


def test_a_stopped_child_past_a_hard_limit_is_killed_and_its_job_fails(
        launch: Launch, limit_jobs: None, r: redis.Redis) -> None:
    swarm = launch(slot("w", concurrency=1, queues=["qs"], child_timeout=60),
                   layout={"w": 1}, **SWARM)
    first = swarm.wait_ready()[("w", 0)]["pid"]
    jid = push_raw(r, "nap", 30, queue="qs", hard_timeout=1)
    wait_for(lambda: r.llen("napping") == 1, timeout=10)
    os.kill(first, signal.SIGSTOP)  # its own timer cannot act: the parent must
    try:
        swarm.wait_events("child.overran", timeout=20)
        wait_for(lambda: retried(r, jid) is not None, timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first, signal.SIGCONT)
    failed = retried(r, jid)
    assert failed is not None and "KILLed" in failed["error_message"]
    swarm.wait_ready(not_pids={first}, timeout=20)
    assert r.llen("woke") == 0 and r.zcard("dead") == 0


# -- wurk run ----------------------------------------------------------------
def test_wurk_run_stops_with_status_75_after_an_overrun(
        r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "clijobs", "-t", "1", "--log-level", "info", WURK_LOG_FORMAT="json")
    jid = push_raw(r, "cli_slow", "x", hard_timeout=0.5)
    assert worker.wait(30) == EX_OVERRAN
    failed = retried(r, jid)
    assert failed is not None and failed["error_class"] == "JobTimeout"
    assert [e for e in worker.events() if e.get("event") == "launcher.recycling"]

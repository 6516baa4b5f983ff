"""Expiring jobs, soft time limits and the retry deadline (issue #15 item 5).

Options are checked where they are given; the rest runs real Launchers
against the suite's redis-server, and the job timer's race (a JobTimeout
landing as a job ends) is driven many times on one thread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from profiled_speed import assert_profiled_code_runs_after
from structlog.testing import capture_logs
from waiting import wait_for

import wurk
from wurk.observe import metrics
from wurk.push.job import JobFunction
from wurk.push.options import make_options
from wurk.runtime.job_timer import JobTimer
from wurk.runtime.launcher import Launcher
from wurk.runtime.retry import RetryHandler
from wurk.runtime.time_limits import JobTimeout, Limits, read
from wurk.runtime.work import UnitOfWork
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

Define = Callable[..., JobFunction[..., Any]]


def only(r: redis.Redis, key: str) -> dict[str, Any]:
    members = r.zrange(key, 0, -1)
    assert len(members) == 1, members
    found: dict[str, Any] = json.loads(members[0])
    return found


# -- options ---------------------------------------------------------------------
@pytest.mark.parametrize(("option", "value", "error"), [
    ("timeout", -1, ValueError), ("timeout", 0, ValueError), ("timeout", math.nan, ValueError),
    ("timeout", math.inf, ValueError), ("timeout", True, TypeError), ("timeout", "5", TypeError),
    ("hard_timeout", 2e9, ValueError), ("expires_in", -0.5, ValueError),
    ("expires_in", False, TypeError), ("expires_at", datetime(2030, 1, 1), ValueError),
    ("expires_at", math.nan, ValueError), ("deadline", "tomorrow", TypeError),
    ("deadline", datetime(2030, 1, 1), ValueError), ("deadline", -5, ValueError),
])
def test_bad_time_options_are_refused_where_given(option: str, value: Any,
                                                  error: type[Exception]) -> None:
    with pytest.raises(error, match=option):
        make_options(**{option: value})
    with pytest.raises(error, match=option):
        wurk.job(name=f"bad_{option}", **{option: value})


def test_hard_timeout_below_timeout_is_refused_also_through_set() -> None:
    with pytest.raises(ValueError, match="hard_timeout"):
        make_options(timeout=10, hard_timeout=5)
    base = make_options(timeout=10)
    with pytest.raises(ValueError, match="hard_timeout"):
        make_options(base, hard_timeout=5)
    assert make_options(base, hard_timeout=10).hard_timeout == 10.0


def test_expires_in_and_expires_at_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="not both"):
        make_options(expires_in=5, expires_at=time.time() + 5)
    at = datetime.now(UTC) + timedelta(hours=1)
    base = make_options(expires_in=60)
    changed = make_options(base, expires_at=at)
    assert (changed.expires_in, changed.expires_at) == (None, at.timestamp())
    assert make_options(changed, expires_in=30).expires_at is None


def test_the_payload_carries_the_limits_and_sidekiq_pros_expiry(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda: None, expires_in=60, timeout=5, hard_timeout=9,
                 deadline=datetime(2040, 1, 1, tzinfo=UTC))
    before = time.time()
    job.perform_async()
    payload = json.loads(r.lrange("queue:default", 0, -1)[0])
    assert before + 60 <= payload["expiry"] <= time.time() + 60
    assert "expires_in" not in payload
    assert (payload["timeout"], payload["hard_timeout"]) == (5.0, 9.0)
    assert payload["deadline"] == datetime(2040, 1, 1, tzinfo=UTC).timestamp()


def test_a_scheduled_jobs_expiry_counts_from_its_run_time(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda: None)
    job.set(expires_in=60).perform_in(3600)
    [(raw, run_at)] = r.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(raw)["expiry"] == pytest.approx(run_at + 60, abs=0.01)
    at = datetime.now(UTC) + timedelta(seconds=30)
    job.set(expires_at=at).perform_in(3600)
    expiries = {json.loads(m)["expiry"] for m in r.zrange("schedule", 0, -1)}
    assert at.timestamp() in expiries


def test_a_raw_push_with_a_bad_expires_in_is_refused(config: Config, r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="expires_in"):
        wurk.Client.default().push({"class": "X", "args": [], "expires_in": -3})
    assert r.llen("queue:default") == 0


# -- expiry at fetch -------------------------------------------------------------
def test_a_job_fetched_past_its_expiry_is_acknowledged_unrun(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    runs: list[str] = []
    job = define(runs.append)
    job.set(expires_at=time.time() - 2).perform_async("late")
    job.set(expires_in=60).perform_async("fresh")
    with capture_logs() as logs:
        launcher = launch()
        wait_for(lambda: runs == ["fresh"] and r.llen("queue:default") == 0, timeout=10)
        launcher.stop(time.monotonic() + 2)
    [expired] = [e for e in logs if e["event"] == "job.expired"]
    assert expired["late"] >= 2 and expired["queue"] == "default"
    assert (r.zcard("retry"), r.zcard("dead")) == (0, 0)
    assert not [k for k in r.keys("wurk:wip:*") if r.type(k) == "list" and r.llen(k)]
    assert runs == ["fresh"]


def test_a_scheduled_job_past_its_expiry_is_dropped(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    runs: list[int] = []
    job = define(lambda: runs.append(1))
    job.set(expires_in=0.2).perform_in(0.3)
    time.sleep(0.8)
    with capture_logs() as logs:
        launch()
        wait_for(lambda: any(e["event"] == "job.expired" for e in logs), timeout=10)
    assert runs == [] and r.zcard("schedule") == 0 and r.zcard("retry") == 0


def test_a_retried_job_past_its_expiry_is_dropped(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    runs: list[int] = []

    def fails() -> None:
        runs.append(1)
        raise RuntimeError("first run fails")

    job = define(fails)
    job.set(expires_in=1.0).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    time.sleep(1.2)
    with capture_logs() as logs:
        # Due now: the poller promotes it, the fetch finds it expired.
        member = r.zrange("retry", 0, -1)[0]
        r.zadd("retry", {member: time.time()})
        wait_for(lambda: any(e["event"] == "job.expired" for e in logs), timeout=10)
    assert runs == [1] and r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_expired_jobs_are_counted_per_class(config: Config, r: redis.Redis, define: Define,
                                            launch_with: Callable[..., Launcher]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as agent:
        agent.bind(("127.0.0.1", 0))
        agent.settimeout(10)
        url = f"udp://127.0.0.1:{agent.getsockname()[1]}"
        observed = dataclasses.replace(config, metrics_url=url, metrics_dogstatsd=True)
        job = define(lambda: None)
        for _ in range(2):
            job.set(expires_at=time.time() - 1).perform_async()
        launch_with(observed)
        expired: list[str] = []
        while len(expired) < 2:  # the heartbeat's gauges come on the same socket
            expired += [line for line in agent.recv(2048).decode().splitlines()
                        if line.startswith("wurk.jobs.expired")]
    assert expired == [f"wurk.jobs.expired:1|c|#class:{job.name},queue:default"] * 2
    totals = metrics.Totals()
    totals.expire(job.name, "default")
    assert f'wurk_jobs_expired_total{{class="{job.name}",queue="default"}} 1' in totals.render()


def test_garbage_limits_from_redis_are_ignored_and_logged(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    runs: list[int] = []
    job = define(lambda: runs.append(1))
    payload = {"class": job.name, "args": [], "queue": "default", "jid": new_jid(),
               "retry": False, "created_at": time.time(), "expiry": "soon", "timeout": True,
               "hard_timeout": 1e300, "deadline": [1]}
    r.lpush("queue:default", json.dumps(payload))
    with capture_logs() as logs:
        launch()
        wait_for(lambda: runs == [1], timeout=10)
    [bad] = [e for e in logs if e["event"] == "job.bad_time_limit"]
    assert bad["fields"] == ["expiry", "timeout", "hard_timeout"]
    assert read({"expiry": float("nan")}, None) == Limits()


# -- soft limit ----------------------------------------------------------------
def test_a_soft_limit_stops_a_pure_python_loop_and_retries(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    def spin() -> None:
        while True:
            pass

    define(spin, timeout=0.3).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    failed = only(r, "retry")
    assert failed["error_class"] == "JobTimeout"
    assert failed["error_message"] == "job ran past its timeout of 0.3s"


def test_a_soft_limit_lands_only_after_a_long_c_call_returns(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    marks: list[str] = []

    def nap() -> None:
        marks.append("asleep")
        time.sleep(1.0)  # one C call: the JobTimeout waits for it to return
        marks.append("after")

    define(nap, timeout=0.2, retry=False).perform_async()
    with capture_logs() as logs:
        launch()
        wait_for(lambda: any(e["event"] == "job.fail" for e in logs), timeout=10)
    [fail] = [e for e in logs if e["event"] == "job.fail"]
    assert "JobTimeout" in fail["error"] and fail["elapsed"] >= 1.0
    assert marks == ["asleep"]


def test_a_job_may_catch_its_soft_limit_to_clean_up(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    cleaned: list[bool] = []

    def tidy() -> None:
        try:
            while True:
                pass
        except JobTimeout:
            cleaned.append(True)
            raise

    define(tidy, timeout=0.2).perform_async()
    launch()
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    assert cleaned == [True]


def test_no_job_timeout_ever_reaches_the_next_job_on_the_thread() -> None:
    """Runs end just before, at, and just after their limit, hundreds of times.

    Whatever the timing, a JobTimeout is either the run's own outcome or
    nothing: none escapes ``run`` and none lands in the code that follows.
    """
    timer = JobTimer(None, None)  # type: ignore[arg-type]
    work = UnitOfWork("default", b"{}")
    rng = random.Random(15)
    outcomes = {"timeout": 0, "ok": 0}
    limit = 0.004

    def busy(seconds: float) -> BaseException | None:
        end = time.perf_counter() + seconds
        try:
            while time.perf_counter() < end:
                pass
        except JobTimeout as exc:
            return exc
        return None

    try:
        for _ in range(400):
            seconds = limit * rng.uniform(0.5, 3.0)
            outcome = timer.run("slot", work, {"jid": "j"}, None, limits=Limits(timeout=limit),
                                call=lambda s=seconds: busy(s))
            outcomes["timeout" if isinstance(outcome, JobTimeout) else "ok"] += 1
            # The "next job": plenty of bytecodes for a stray delivery, caught by no one.
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
    finally:
        timer.stop()
    assert outcomes["timeout"] > 40 and outcomes["ok"] > 40, outcomes


def test_many_short_jobs_under_a_limit_just_above_their_time_all_succeed(
        config: Config, r: redis.Redis, define: Define,
        launch: Callable[..., Launcher]) -> None:
    done: list[int] = []
    lock = threading.Lock()

    def short(i: int) -> None:
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        with lock:
            done.append(i)

    # Ten threads share the GIL on a loaded machine: a 5 ms spin can take a
    # few hundred ms of wall time, so the limit leaves room for that.
    job = define(short, timeout=2.0)
    job.perform_bulk([[i] for i in range(200)])
    launch()
    wait_for(lambda: len(done) == 200, timeout=30)
    assert sorted(done) == list(range(200))
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_no_timer_thread_without_limits(config: Config, r: redis.Redis, define: Define,
                                        launch: Callable[..., Launcher]) -> None:
    runs: list[int] = []
    define(lambda: runs.append(1)).perform_async()
    launch()
    wait_for(lambda: runs == [1], timeout=10)
    assert not [t for t in threading.enumerate() if t.name == "wurk-job-timer"]


# -- deadline ------------------------------------------------------------------
def test_no_retry_past_the_deadline(config: Config, r: redis.Redis, define: Define,
                                    launch: Callable[..., Launcher]) -> None:
    def fails() -> None:
        raise RuntimeError("nope")

    job = define(fails)
    # Sidekiq's first retry waits at least 15 s: past a deadline 5 s away.
    job.set(deadline=time.time() + 5).perform_async()
    job.set(deadline=time.time() + 3600).perform_async()
    launch()
    wait_for(lambda: r.zcard("dead") == 1 and r.zcard("retry") == 1, timeout=10)


def test_the_deadline_comparison_is_the_next_retrys_time(config: Config) -> None:
    handler = RetryHandler(config, rng=random.Random(1))
    now = time.time()
    base = {"class": "X", "args": [], "jid": new_jid(), "queue": "default", "retry": True}
    kept = handler.plan({**base, "deadline": now + 60}, "default", RuntimeError("x"), None)
    assert kept.outcome == "retry" and kept.at <= now + 60
    gone = handler.plan({**base, "deadline": now + 14}, "default", RuntimeError("x"), None)
    assert gone.outcome == "dead"
    dropped = handler.plan({**base, "deadline": now, "dead": False}, "default",
                           RuntimeError("x"), None)
    assert dropped.outcome == "dropped"
    garbage = handler.plan({**base, "deadline": "soon"}, "default", RuntimeError("x"), None)
    assert garbage.outcome == "retry"


TIMED_OUT_THEN_BUSY = """
import functools, time
from wurk.runtime.job_timer import JobTimer
from wurk.runtime.time_limits import JobTimeout, Limits
from wurk.runtime.work import UnitOfWork

timer = JobTimer(None, None)
work = UnitOfWork("default", b"{}")
for _ in range(3):
    # A job blocked in one C call past its limit: the JobTimeout is still
    # pending when the call returns, and lands as the run ends.
    outcome = timer.run("slot", work, {"jid": "j"}, None, limits=Limits(timeout=0.05),
                        call=functools.partial(time.sleep, 0.2))
    assert outcome is None or isinstance(outcome, JobTimeout), outcome
timer.stop()

"""


def test_a_timed_out_run_leaves_profiled_code_running_at_full_speed(tmp_path: Any) -> None:
    """Regression: dropping a pending JobTimeout with SetAsyncExc(tid, NULL) left
    CPython 3.11's "async exception pending" flag set for good, and from then on
    code under cProfile crawled (300,000 calls took minutes: the suite hung in
    profiled jobs run after time-limit tests)."""
    assert_profiled_code_runs_after(TIMED_OUT_THEN_BUSY, tmp_path)

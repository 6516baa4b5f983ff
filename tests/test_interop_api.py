"""Each side's admin API reads the other side's state.

Sidekiq's own API (Stats, Queue, ProcessSet, Workers, RetrySet,
ScheduledSet, DeadSet), run by Ruby (tests/interop/api.rb), reads a live
wurk process, and its quiet!/stop! reach it. wurk.api reads a live Ruby
``sidekiq`` process, its in-flight job, Ruby-scheduled jobs, and its
quiet/stop reach Ruby. (Retry and dead entries Ruby wrote, read through
wurk.api: tests/test_interop_wurk_to_ruby.py.)
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from conftest import RedisServer
from test_interop_support import (
    ARGS,
    PY_RUNS,
    RUBY_RUNS,
    assert_exact,
    derive,
    launched,
    private_redis,
    python_jobs,
    require_ruby,
    ruby_sidekiq,
    run_ruby,
    wait_run,
)
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.api import ProcessSet, Queue, ScheduledSet, Stats, Workers
from wurk.redis.runtime import close_runtime
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config


def days_of_this_test() -> set[str]:
    """Today, and yesterday too: a run that crosses midnight UTC stamps either."""
    now = time.time()
    return {datetime.fromtimestamp(now - back, UTC).strftime("%Y-%m-%d") for back in (0, 600)}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server (see private_redis)."""
    with private_redis() as server:
        yield server


@pytest.fixture
def wurk_config(config: Config) -> Iterator[Config]:
    """Settings Sidekiq should report back: tag, labels, concurrency, two queues."""
    require_ruby()
    cfg = derive(config, tag="interop-tag", labels=["py", "wurk"], concurrency=3,
                 queues=["default", "other"], shutdown_timeout=0.5)
    wurk.configure(cfg)
    try:
        yield cfg
    finally:
        close_runtime(cfg)


def ruby_dump(config: Config) -> dict[str, Any]:
    dump: dict[str, Any] = run_ruby(config.redis_url, "api.rb", "dump")
    return dump


def utc_day(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


class WurkState:
    """A wurk process with finished, failed, dead, scheduled and running jobs."""

    def __init__(self, config: Config, r: redis.Redis, launcher: Launcher) -> None:
        client = wurk.Client(config)
        self.echo = [client.push({"class": "PyEcho", "args": [n]}) for n in range(3)]
        self.retry = client.push({"class": "PyFail", "args": ARGS})
        self.dead = client.push({"class": "PyFail", "args": ["dies"], "retry": 0})
        self.at = time.time() + 600
        self.scheduled = client.push({"class": "PyEcho", "args": ARGS, "at": self.at})
        self.parked = client.push({"class": "PyEcho", "args": ["parked"], "queue": "parked"})
        self.slow = client.push({"class": "PySlow", "args": ARGS})
        wait_run(r, PY_RUNS, self.slow)
        # Wait for a beat that flushed every count and shows the running job.
        wait_for(lambda: int(r.get("stat:processed") or 0) == 5
                 and r.hget(launcher.identity, "busy") == "1", what="wurk's heartbeat")


def test_sidekiq_api_reads_a_live_wurk_process(wurk_config: Config, r: redis.Redis) -> None:
    config = wurk_config
    with python_jobs(config) as release, launched(config) as launcher:
        started = time.time()
        state = WurkState(config, r, launcher)
        dump = ruby_dump(config)
        release.set()

    stats = dump["stats"]
    assert stats | {"default_queue_latency": 0} == {
        "processed": 5, "failed": 2, "scheduled_size": 1, "retry_size": 1, "dead_size": 1,
        "processes_size": 1, "workers_size": 1, "enqueued": 1, "default_queue_latency": 0,
        "queues": {"parked": 1, "default": 0}}  # "other": known only once pushed to
    [(day, processed)] = dump["history"].items()
    assert processed == 5 and day in days_of_this_test()
    [parked] = [q for q in dump["queues"] if q["name"] == "parked"]
    [job] = parked["jobs"]
    assert (job["jid"], job["klass"], job["args"]) == (state.parked, "PyEcho", ["parked"])
    assert 0 <= parked["latency"] < 30

    [process] = dump["processes"]
    assert process["identity"] == launcher.identity
    assert (process["hostname"], process["pid"]) == (socket.gethostname(), os.getpid())
    assert (process["concurrency"], process["queues"], process["busy"]) == (
        3, ["default", "other"], 1)
    assert (process["tag"], process["labels"]) == ("interop-tag", ["py", "wurk"])
    assert (process["quiet"], process["stopping"]) == ("false", False)
    assert process["beat"] == pytest.approx(time.time(), abs=10)
    assert started - 5 <= process["started_at"] <= started + 5
    assert process["rss"] > 1000  # KB
    assert dump["total_concurrency"] == 3

    [work] = dump["workers"]
    assert (work["process"], work["queue"], work["class"], work["jid"]) == (
        launcher.identity, "default", "PySlow", state.slow)
    assert_exact(work["args"], ARGS)
    assert isinstance(work["run_at"], int) and abs(work["run_at"] - started) < 30
    assert dump["workers_size"] == 1

    [retry] = dump["retry"]
    assert (retry["jid"], retry["klass"], retry["queue"]) == (state.retry, "PyFail", "default")
    assert (retry["error"], retry["error_class"]) == (True, "PyFailure")
    assert retry["error_message"] == "python says no: é 日本"
    assert (retry["retry_count"], retry["retry"]) == (0, True)
    assert retry["failed_at_class"] == "Time"
    assert retry["failed_at"] == pytest.approx(time.time(), abs=30)
    assert retry["failed_at_iso"][:10] in days_of_this_test()  # a float in seconds, not ms
    assert retry["at"] > retry["failed_at"] + 14  # Sidekiq's first backoff is 15 s or more
    backtrace = retry["error_backtrace"]  # Ruby inflated and parsed wurk's base64(zlib(JSON))
    assert isinstance(backtrace, list) and all(isinstance(line, str) for line in backtrace)
    assert re.search(r"test_interop_support\.py:\d+:in `perform'", backtrace[0])
    assert_exact(retry["args"], ARGS)

    [dead] = dump["dead"]
    assert (dead["jid"], dead["error_class"], dead["retry_count"]) == (
        state.dead, "PyFailure", 0)
    assert dead["at"] == pytest.approx(time.time(), abs=30)
    assert utc_day(dead["failed_at"]) in days_of_this_test()

    [scheduled] = dump["scheduled"]
    assert (scheduled["jid"], scheduled["klass"]) == (state.scheduled, "PyEcho")
    assert scheduled["at"] == pytest.approx(state.at, abs=0.001)
    assert scheduled["enqueued_at"] is None and scheduled["error"] is False
    assert_exact(scheduled["args"], ARGS)


def test_sidekiq_quiet_and_stop_reach_a_wurk_process(wurk_config: Config,
                                                     r: redis.Redis) -> None:
    config = wurk_config
    stop_requested = threading.Event()
    with python_jobs(config), launched(config, on_stop_request=stop_requested.set) as launcher:
        jid = wurk.Client(config).push({"class": "PySlow", "args": ARGS})
        wait_run(r, PY_RUNS, jid)
        run_ruby(config.redis_url, "api.rb", "quiet", launcher.identity)
        wait_for(lambda: r.hget(launcher.identity, "quiet") == "true", what="quiet beat")
        assert launcher.manager.quieting
        [process] = ruby_dump(config)["processes"]
        assert (process["identity"], process["stopping"]) == (launcher.identity, True)

        run_ruby(config.redis_url, "api.rb", "stop", launcher.identity)
        assert stop_requested.wait(EVENTUALLY)  # `wurk run` stops the process on this
        assert launcher.stop() == 1  # PySlow was still running: pushed back
    dump = ruby_dump(config)
    assert dump["processes"] == [] and dump["stats"]["processes_size"] == 0
    [queue] = [q for q in dump["queues"] if q["name"] == "default"]
    [job] = queue["jobs"]
    assert (job["jid"], job["klass"]) == (jid, "PySlow")  # Sidekiq sees it queued again
    assert_exact(job["args"], ARGS)


def test_wurk_api_reads_a_live_ruby_process(config: Config, r: redis.Redis) -> None:
    client = wurk.Client(config)
    with ruby_sidekiq(config.redis_url, r, "-q", "default", "-q", "other", "-g", "rb-tag",
                      concurrency=3) as ruby:
        echo = [client.push({"class": "RbEcho", "args": [n]}) for n in range(2)]
        for jid in echo:
            wait_run(r, RUBY_RUNS, jid)
        slow = client.push({"class": "RbSlow", "args": [8, "é 日本"]})
        wait_run(r, RUBY_RUNS, slow)
        processes = ProcessSet(config=config)
        wait_for(lambda: [p.busy for p in processes] == [1], what="Ruby's busy beat")
        [process] = processes
        host, pid, nonce = process.identity.rsplit(":", 2)
        assert process.identity == ruby.identity and re.fullmatch(r"[0-9a-f]{12}", nonce)
        assert (process.hostname, process.pid, int(pid)) == (host, ruby.pid, ruby.pid)
        assert (process.concurrency, process.queues, process.tag) == (
            3, ["default", "other"], "rb-tag")
        assert (process.busy, process.is_quiet, process.embedded) == (1, False, False)
        assert process.beat == pytest.approx(time.time(), abs=5)
        assert process.started_at == pytest.approx(time.time(), abs=30)
        assert process.rss > 1000 and process.version is None  # 6.4 sends no version
        assert processes.total_concurrency == 3

        [(identity, thread, work)] = Workers(config=config)
        assert (identity, work.queue, work.job.klass, work.job.jid) == (
            ruby.identity, "default", "RbSlow", slow)
        assert work.job.args == [8, "é 日本"] and thread
        assert work.run_at == pytest.approx(time.time(), abs=30)
        assert Workers(config=config).size == 1
        stats = wait_for(lambda: (s := Stats(config=config)).processed == 2 and s,
                         what="Ruby's stats flush")
        assert (stats.failed, stats.processes_size, stats.workers_size) == (0, 1, 1)

        process.quiet()
        wait_for(lambda: ProcessSet(config=config).lookup(ruby.identity).is_quiet,
                 what="Ruby quiet")
        process.stop()
        assert ruby.proc.wait(15) == 0  # Ruby obeyed TERM from wurk.api and exited cleanly
    # Sidekiq 6.4 removes itself at exit but leaves its heartbeat thread
    # running: a beat that lands between that removal and the exit adds the
    # process back, marked quiet, until its key expires. Either is correct.
    left = ProcessSet(config=config).get(ruby.identity)
    assert left is None or left.is_quiet
    assert [p.identity for p in ProcessSet(config=config)] in ([], [ruby.identity])
    [record] = list(Queue("default", config=config))  # RbSlow, requeued by Ruby's shutdown
    assert (record.jid, record.klass, record.args) == (slow, "RbSlow", [8, "é 日本"])


def test_wurk_api_reads_jobs_ruby_queued_and_scheduled(config: Config, r: redis.Redis) -> None:
    now = time.time()
    [queued] = run_ruby(config.redis_url, "push.rb", "client_push")["jids"]
    pushed = run_ruby(config.redis_url, "push.rb", "perform_in", "600")
    [record] = list(Queue("default", config=config))
    assert (record.jid, record.klass, record.queue) == (queued, "PyEcho", "default")
    assert_exact(record.args, ARGS)
    assert record.enqueued_at == pytest.approx(now, abs=30)
    assert 0 <= Queue("default", config=config).latency < 30

    [entry] = ScheduledSet(config=config)
    assert (entry.jid, entry.klass) == (pushed["jids"][0], "PyEcho")
    # Exactly the score Ruby wrote; the script's own clock read came just before it.
    assert entry.at == r.zscore("schedule", r.zrange("schedule", 0, 0)[0])
    assert entry.at == pytest.approx(pushed["at"], abs=5)
    assert entry.enqueued_at is None and entry.created_at == pytest.approx(now, abs=30)
    assert_exact(entry.args, ARGS)

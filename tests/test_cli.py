"""``wurk run`` as a real subprocess: jobs, JSON logs, signals and exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
from cli_workers import Worker, child_env, push, registered_identity, wait_quiet
from conftest import RedisServer, fill_to_maxmemory, free_port
from faultproxy import FaultProxy
from waiting import EVENTUALLY, wait_beats, wait_for

from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.reaper import recover
from wurk.settings.config import Config

EX_CONFIG = 78

jobs_dir = cli_workers.jobs_dir
spawn = cli_workers.spawn


def test_run_processes_jobs_and_logs_json(r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    jids = [push(r, "cli_echo", i)[0] for i in range(3)]
    worker = spawn("-r", "clijobs", "--log-level", "info", "-c", "2")
    wait_for(lambda: r.llen("cli:done") == 3 or worker.proc.poll() is not None)
    assert worker.proc.poll() is None, worker.stderr()
    assert sorted(r.lrange("cli:done", 0, -1)) == ["0", "1", "2"]

    def done_events() -> list[dict[str, Any]]:
        return [e for e in worker.events() if e.get("event") == "job.done"]

    wait_for(lambda: len(done_events()) == 3)
    events = done_events()
    assert sorted(e["jid"] for e in events) == sorted(jids)
    for event in events:
        assert event["class"] == "cli_echo"
        assert event["queue"] == "default"
        assert isinstance(event["elapsed"], float)
        assert event["elapsed"] >= 0

    identity = registered_identity(r, worker)
    worker.send(signal.SIGTERM)
    assert worker.wait(EVENTUALLY) == 0
    assert r.smembers("processes") == set()
    assert not r.exists(f"{identity}:work")
    assert int(r.get("stat:processed") or 0) == 3


def test_sigterm_requeues_a_running_job(r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    _, raw = push(r, "cli_slow", "long")
    # A 1.2 s fetch, longer than the 1 s deadline: idle threads are still in
    # BRPOP when the job is pushed back (they must not take it away). It ends
    # well before the deadline plus STOP_MARGIN: the stop waits for that fetch
    # within STOP_MARGIN, and a fetch outlasting it (Sidekiq's 2 s, say) would
    # leave the goodbye no time, so the identity would stay listed.
    worker = spawn("-r", "clijobs", "-t", "1", "--log-level", "info", WURK_FETCH_TIMEOUT="1.2")
    wait_for(lambda: r.llen("cli:started") == 1 or worker.proc.poll() is not None)
    assert worker.proc.poll() is None, worker.stderr()
    assert r.llen("queue:default") == 0
    t0 = time.monotonic()
    worker.send(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.stderr()
    # The 1 s deadline plus STOP_MARGIN, five times over for a loaded machine;
    # a shutdown that waited for the job would take its 30 s.
    assert time.monotonic() - t0 < 10.0
    assert r.lrange("queue:default", 0, -1) == [raw], worker.stderr()
    # This worker took itself out (another test's process may beat into the flushed
    # server meanwhile: only this one's identity is ours to check).
    assert not [i for i in r.smembers("processes") if f":{worker.proc.pid}:" in i], \
        worker.stderr()
    assert any(e.get("event") == "shutdown.requeued" for e in worker.events())


def test_sigtstp_quiets(r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "clijobs", "--log-level", "info")
    identity = registered_identity(r, worker)
    assert r.hget(identity, "quiet") == "false"
    worker.send(signal.SIGTSTP)
    # Quiet, and no processor thread is left that could run a job.
    wait_quiet(r, worker, identity)
    assert worker.proc.poll() is None
    push(r, "cli_echo", "after-quiet")
    wait_beats(r, identity)  # still running, with time for a fetch it must not make
    assert r.llen("queue:default") == 1
    assert r.llen("cli:done") == 0
    worker.send(signal.SIGTERM)
    assert worker.wait(EVENTUALLY) == 0


def test_sigttin_dumps_threads(r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "clijobs")
    registered_identity(r, worker)
    worker.send(signal.SIGTTIN)
    # One event per thread: wait until the ones asserted below have all arrived.
    dumps = wait_for(lambda: (lambda found: found if {"MainThread", "wurk-heartbeat"} <= {
        e.get("thread") for e in found} else [])(
        [e for e in worker.events() if e.get("event") == "thread.dump"]))
    names = {e["thread"] for e in dumps}
    assert "MainThread" in names
    assert "wurk-heartbeat" in names
    assert worker.proc.poll() is None
    worker.send(signal.SIGTERM)
    assert worker.wait(EVENTUALLY) == 0


def test_remote_tstp_through_redis(r: redis.Redis, spawn: Callable[..., Worker]) -> None:
    worker = spawn("-r", "clijobs")
    identity = registered_identity(r, worker)
    r.lpush(f"{identity}-signals", "TSTP")
    wait_for(lambda: r.hget(identity, "quiet") == "true")
    r.lpush(f"{identity}-signals", "TERM")
    assert worker.wait(EVENTUALLY) == 0
    assert r.smembers("processes") == set()


def run_cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wurk.cli", "run", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=20, check=False,
    )


@pytest.mark.parametrize(("toml", "needle"), [
    ('[wurk]\nconcurrency = "ten"\n', "concurrency"),
    ("[wurk]\nconcurency = 3\n", "concurency"),
    ("[wurk]\nshutdown_timeout = -1\n", "shutdown_timeout"),
    ("[wurk\nconcurrency = 3\n", "invalid TOML"),
])
def test_bad_config_file_exits_78(redis_server: RedisServer, tmp_path: Path, toml: str,
                                  needle: str) -> None:
    path = tmp_path / "wurk.toml"
    path.write_text(toml)
    result = run_cli("--config", str(path), env=child_env(redis_server.url, tmp_path),
                     cwd=tmp_path)
    assert result.returncode == EX_CONFIG, result.stderr
    assert needle in result.stderr
    assert str(path) in result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["-c", "0"], "concurrency"),
    (["-t", "-5"], "shutdown_timeout"),
    (["--log-level", "loud"], "log_level"),
])
def test_bad_flag_exits_78(redis_server: RedisServer, tmp_path: Path, args: list[str],
                           needle: str) -> None:
    result = run_cli(*args, env=child_env(redis_server.url, tmp_path), cwd=tmp_path)
    assert result.returncode == EX_CONFIG, result.stderr
    assert needle in result.stderr


def test_bad_env_exits_78(redis_server: RedisServer, tmp_path: Path) -> None:
    env = child_env(redis_server.url, tmp_path)
    env["WURK_CONCURRENCY"] = "lots"
    result = run_cli(env=env, cwd=tmp_path)
    assert result.returncode == EX_CONFIG
    assert "WURK_CONCURRENCY" in result.stderr


@pytest.mark.parametrize(("args", "env", "toml", "needle"), [
    (["-t", "1e10"], {}, None, "arguments: shutdown_timeout must be from 0 to 86400"),
    (["-c", "10000000"], {}, None, "arguments: concurrency must be from 1 to 1000"),
    (["-q", "a:100000000000"], {}, None, "arguments: queues has a weight above"),
    ([], {"WURK_SHUTDOWN_TIMEOUT": "1e10"}, None,
     "environment: WURK_SHUTDOWN_TIMEOUT: shutdown_timeout"),
    ([], {"WURK_REDIS_POOL_SIZE": "99999999"}, None,
     "environment: WURK_REDIS_POOL_SIZE: redis_pool_size"),
    ([], {"REDIS_URL": "redis://127.0.0.1:99999/0"}, None, "environment: REDIS_URL: redis_url"),
    ([], {"REDIS_URL": "redis://127.0.0.1:6379/abc"}, None, "environment: REDIS_URL: redis_url"),
    ([], {}, 'queues = ["a:1000000", "b"]', "wurk.toml: queues has a weight above"),
    ([], {}, "reaper_interval = 1e9", "wurk.toml: reaper_interval must be from"),
])
def test_absurd_settings_exit_78_in_one_line(redis_server: RedisServer, tmp_path: Path,
                                             args: list[str], env: dict[str, str],
                                             toml: str | None, needle: str) -> None:
    if toml is not None:
        (tmp_path / "wurk.toml").write_text(f"[wurk]\n{toml}\n")
        args = [*args, "-C", str(tmp_path / "wurk.toml")]
    result = run_cli(*args, env={**child_env(redis_server.url, tmp_path), **env}, cwd=tmp_path)
    assert result.returncode == EX_CONFIG, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("wurk: ") and needle in line


def test_missing_job_module(redis_server: RedisServer, tmp_path: Path) -> None:
    result = run_cli("-r", "no_such_module_for_wurk",
                     env=child_env(redis_server.url, tmp_path), cwd=tmp_path)
    assert result.returncode != 0
    assert "no_such_module_for_wurk" in result.stderr
    assert "cannot load jobs" in result.stderr
    assert "Traceback" not in result.stderr


def test_job_module_that_raises_on_import(redis_server: RedisServer, tmp_path: Path) -> None:
    (tmp_path / "broken_jobs.py").write_text("raise RuntimeError('kaboom at import')\n")
    result = run_cli("-r", "broken_jobs", env=child_env(redis_server.url, tmp_path),
                     cwd=tmp_path)
    assert result.returncode != 0
    assert "kaboom at import" in result.stderr
    assert "broken_jobs" in result.stderr


def test_job_module_by_path(r: redis.Redis, spawn: Callable[..., Worker],
                            jobs_dir: Path) -> None:
    push(r, "cli_echo", "by-path")
    worker = spawn("-r", str(jobs_dir / "clijobs.py"))
    wait_for(lambda: r.lrange("cli:done", 0, -1) == ["by-path"]
             or worker.proc.poll() is not None)
    assert worker.proc.poll() is None, worker.stderr()
    worker.send(signal.SIGINT)
    assert worker.wait(EVENTUALLY) == 0


# -- Redis trouble at start and at stop -----------------------------------------------

def unreachable(worker: Worker) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e.get("event") == "redis.unreachable"]


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def wait_unreachable(worker: Worker, count: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        assert worker.proc.poll() is None, worker.stderr()
        events = unreachable(worker)
        return events if len(events) >= count else None
    return wait_for(enough, 15, what=f"{count} redis.unreachable lines")  # type: ignore[no-any-return]


def test_run_waits_for_an_unreachable_redis_and_starts_when_it_returns(
        r: redis.Redis, redis_server: RedisServer, spawn: Callable[..., Worker]) -> None:
    proxy = FaultProxy(redis_server.port)
    proxy.refuse()
    try:
        push(r, "cli_echo", "after-the-outage")
        worker = spawn("-r", "clijobs", REDIS_URL=proxy.url)
        lines = wait_unreachable(worker, 3)
        assert [(e["attempt"], e["retry_in"]) for e in lines[:3]] == [(1, 0.5), (2, 1.0),
                                                                      (3, 2.0)]
        assert lines[0]["url"] == proxy.url
        proxy.heal()
        wait_for(lambda: r.lrange("cli:done", 0, -1) == ["after-the-outage"], 15)
        assert any(e.get("event") == "redis.reachable" for e in worker.events())
        worker.send(signal.SIGTERM)
        assert worker.wait(10) == 0
    finally:
        proxy.close()


@pytest.mark.parametrize("scheme", ["redis", "rediss"], ids=["nothing-listens", "tls-to-plain"])
def test_term_while_waiting_for_redis_exits_0_at_once(
        redis_server: RedisServer, spawn: Callable[..., Worker], scheme: str) -> None:
    # Nothing listens on a fresh port; a plain redis-server never answers a
    # TLS ClientHello, so that handshake hangs until a timeout ends it.
    port = free_port() if scheme == "redis" else redis_server.port
    worker = spawn("-r", "clijobs", REDIS_URL=f"{scheme}://:hunter2@127.0.0.1:{port}/0",
                   WURK_REDIS_CONNECT_TIMEOUT="0.5", WURK_REDIS_READ_TIMEOUT="30")
    first, second = wait_unreachable(worker, 2)[:2]
    # One attempt lasts at most the connect timeout (the handshake included),
    # not the read timeout: 0.5 s pause + 0.5 s dial, five times over for a
    # loaded machine, and still far from the 30 s read timeout.
    assert at(second) - at(first) < 5.0
    assert first["url"] == f"{scheme}://:***@127.0.0.1:{port}/0"
    time.sleep(1.2)  # into the third attempt: a dial (TLS) or a pause (refused)
    started = time.monotonic()
    worker.send(signal.SIGTERM)
    assert worker.wait(20) == 0
    # About 0.2 s on an idle host (interpreter exit); before: 14-44 s, TERM or not.
    assert time.monotonic() - started < 8.0
    assert "hunter2" not in worker.stderr()


def test_worker_starts_and_drains_its_queue_at_maxmemory(
        spawn: Callable[..., Worker], own_redis: RedisServer, tmp_path: Path) -> None:
    server = own_redis
    client = server.client()
    done = tmp_path / "done.txt"
    try:
        for i in range(40):
            push(client, "cli_touch", str(done), i)
        fill_to_maxmemory(client)
        worker = spawn("-r", "clijobs", "-c", "2", REDIS_URL=server.url)
        wait_for(lambda: worker.proc.poll() is not None
                 or (done.exists() and len(done.read_text().split()) == 40), 30)
        assert worker.proc.poll() is None, worker.stderr()  # before: exit 70 at start
        # Every job acknowledged: nothing left in the queue or a private list.
        wait_for(lambda: client.llen("queue:default") == 0 and not any(
            client.llen(k) for k in client.scan_iter("wurk:wip:*") if client.type(k) == "list"))
        assert sorted(int(v) for v in done.read_text().split()) == list(range(40))
        # The beat lands at maxmemory (the process stays visible); the stats
        # flush does not, and says so without stopping anything.
        assert len(client.smembers("processes")) == 1
        assert any(e.get("event") == "heartbeat.flush_failed" for e in worker.events())
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("still", "full")
        worker.send(signal.SIGTERM)
        assert worker.wait(15) == 0
    finally:
        client.close()


def test_term_while_redis_hangs_drains_on_time_and_loses_nothing(
        spawn: Callable[..., Worker], own_redis: RedisServer) -> None:
    server = own_redis
    client = server.client()
    try:
        raws = [push(client, "cli_slow", i)[1] for i in range(2)]
        # A 30 s read timeout: a drain that waited on a reply would show.
        worker = spawn("-r", "clijobs", "-c", "2", "-t", "1", REDIS_URL=server.url,
                       WURK_REDIS_READ_TIMEOUT="30")
        wait_for(lambda: client.llen("cli:started") == 2, 15)
        identity = registered_identity(client, worker)
        # A stopped server: dials still land in its backlog, replies never come.
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            worker.send(signal.SIGTERM)
            code = worker.wait(40)
            elapsed = time.monotonic() - started
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert code == 0, worker.stderr()
        # shutdown_timeout 1 s, then at most STOP_MARGIN (1 s) for Redis, plus
        # exit: five times that for a loaded machine, and under one read timeout.
        assert elapsed < 10.0, f"{elapsed:.1f} s; the worker said:\n{worker.stderr()}"
        # Both jobs are still in Redis: given back, or left in the private list
        # for the reaper; recovering that list puts them back.
        config = Config(redis_url=server.url)
        try:
            recover(runtime_for(config), identity)
        finally:
            close_runtime(config)
        assert sorted(client.lrange("queue:default", 0, -1)) == sorted(raws)
    finally:
        client.close()


def test_term_in_an_outage_spools_buffered_pushes_within_the_drain(
        spawn: Callable[..., Worker], own_redis: RedisServer, tmp_path: Path) -> None:
    client = own_redis.client()
    flag = tmp_path / "push-now"
    try:
        push(client, "cli_push_later", str(flag))
        # A 30 s flush timeout: an exit flush that waited it out would show.
        worker = spawn("-r", "clijobs", "-t", "1", REDIS_URL=own_redis.url,
                       WURK_PUSH_FLUSH_TIMEOUT="30")
        wait_for(lambda: client.llen("cli:started") == 1, 15)
        own_redis.stop()
        flag.touch()  # the job pushes now: Redis is down, so the push is buffered
        wait_for(lambda: any(e.get("event") == "push.buffered" for e in worker.events()), 15,
                 what="the push buffered")
        started = time.monotonic()
        worker.send(signal.SIGTERM)
        assert worker.wait(45) == 0, worker.stderr()
        elapsed = time.monotonic() - started
        # Before: the exit flush waited push_flush_timeout (here 30 s) past the
        # 1 s drain; now the drain and exit, five times over for a loaded machine.
        assert elapsed < 10.0, f"{elapsed:.1f} s; the worker said:\n{worker.stderr()}"
        spooled = [e for e in worker.events() if e.get("event") == "push.spooled"]
        assert spooled and spooled[0]["jobs"] == 1, worker.stderr()
    finally:
        client.close()


HOOKED_MODULE = """
import dataclasses

import clijobs  # noqa: F401 - the jobs

from wurk.settings.config import when_configured


def _hook(config):
    # A field an integration cannot extend in place comes back in a copy.
    return dataclasses.replace(config, queues=["hooked"])


when_configured(_hook)
"""


def test_run_works_with_the_copy_a_module_loaded_by_require_installed(
        r: redis.Redis, spawn: Callable[..., Worker], jobs_dir: Path) -> None:
    # wurk.contrib.django.boot loaded by -r does this: its when_configured
    # callback returns a copy (settings.WURK's on_redis_error) that becomes the
    # default after `wurk run` installed its own; the worker must run that copy.
    (jobs_dir / "hooked.py").write_text(HOOKED_MODULE)
    push(r, "cli_echo", "from the hooked queue", queue="hooked")
    worker = spawn("-r", "hooked")
    wait_for(lambda: r.llen("cli:done") == 1 or worker.proc.poll() is not None,
             timeout=EVENTUALLY)
    assert worker.proc.poll() is None, worker.stderr()
    assert r.lrange("cli:done", 0, -1) == ["from the hooked queue"]

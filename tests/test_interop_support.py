"""Helpers for the Ruby Sidekiq interop tests (no tests of its own).

Runs real Ruby: ``sidekiq`` server processes loading tests/interop/worker.rb,
one-shot scripts using Sidekiq's client and API (tests/interop/*.rb), and
Sidekiq's web app. Every Ruby process is bounded in time and stopped on the
way out. A machine without Ruby Sidekiq fails these tests, loudly, with the
apt command that installs it; it never skips them.

Both sides record what their jobs received in Redis: Ruby jobs in
``interop:ruby-runs``, Python jobs in ``interop:py-runs``, one JSON object per
run with the class, jid, args, the Ruby class name of every argument (as
Ruby spells them, so both sides compare alike) and the job payload.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import pytest
import redis
from conftest import RedisServer, start_redis
from waiting import wait_for

import wurk
from wurk.push.job import registry
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.payload import dumps

INTEROP = Path(__file__).resolve().parent / "interop"
APT_INSTALL = "apt-get install -y ruby ruby-sidekiq ruby-rack ruby-webrick"
RUBY_RUNS = "interop:ruby-runs"
PY_RUNS = "interop:py-runs"
RUBY_TIMEOUT = 20.0

# The same values as INTEROP_ARGS in tests/interop/args.rb.
ARGS: list[Any] = [
    "plain",
    "é",
    "日本",
    "emoji 😀 🎉",
    "",
    "quote \" backslash \\ newline \n tab \t bell \u0007",
    {"clé": "valeur", "日本": ["語"]},
    {"nested": {"list": [1, [2, {"deep": None}]], "flag": False}, "empty": {}},
    [[], [1, "two", 3.5], {"k": "v"}],
    2**63 + 1,
    -(2**70),
    0,
    -1,
    0.1,
    1e300,
    -2.5e-8,
    None,
    True,
    False,
]


def ruby_types(value: Any) -> Any:
    """Each value's class as Ruby names it, recursively (Integer vs Float matters)."""
    if isinstance(value, list):
        return [ruby_types(v) for v in value]
    if isinstance(value, dict):
        return {k: ruby_types(v) for k, v in value.items()}
    if value is None:
        return "NilClass"
    if isinstance(value, bool):
        return "TrueClass" if value else "FalseClass"
    names = {str: "String", int: "Integer", float: "Float"}
    return names[type(value)]


def assert_exact(received: Any, expected: Any) -> None:
    """Same values, same types, same key order: the JSON texts must match."""
    assert json.dumps(received) == json.dumps(expected)
    assert ruby_types(received) == ruby_types(expected)


@contextmanager
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of the interop tests' own.

    Each interop module overrides the ``redis_server`` fixture with one, so a
    process another test left behind (a heartbeat still beating, a fetcher
    still blocking) can never touch the exact counts and process lists
    these tests compare with what Ruby reports.
    """
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def module_redis_server() -> Iterator[RedisServer]:
    """A module's own redis-server: assign it as ``redis_server`` in the module."""
    with private_redis() as server:
        yield server


@pytest.fixture(scope="module")
def module_ruby(redis_server: RedisServer) -> Iterator[RubySidekiq]:
    """One Ruby Sidekiq for the module: assign it as ``ruby`` in the module."""
    with redis_server.client() as r, ruby_sidekiq(redis_server.url, r) as server:
        yield server


# -- Ruby availability -------------------------------------------------------
@functools.cache
def _ruby_problem() -> str | None:
    for tool in ("ruby", "sidekiq", "rackup"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH"
    probe = ('require "sidekiq"; require "sidekiq/api"; require "sidekiq/web"; '
             'require "rack"; require "webrick"; print Sidekiq::VERSION')
    try:
        done = subprocess.run(["ruby", "-e", probe], capture_output=True, text=True,
                              timeout=RUBY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return "ruby took too long to load sidekiq"
    if done.returncode != 0:
        return f"ruby cannot load sidekiq, rack and webrick: {done.stderr.strip()[-500:]}"
    return None


def require_ruby() -> None:
    """Fail (never skip) when Ruby Sidekiq, Rack or WEBrick is missing."""
    problem = _ruby_problem()
    if problem is not None:
        pytest.fail(f"Ruby Sidekiq interop needs Debian's Ruby packages: {problem}. "
                    f"Install them with: {APT_INSTALL} (scripts/test does this)",
                    pytrace=False)


def ruby_env(redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update(REDIS_URL=redis_url, LANG="C.UTF-8", LC_ALL="C.UTF-8")
    return env


def run_ruby(redis_url: str, script: str, *argv: str, timeout: float = RUBY_TIMEOUT) -> Any:
    """Run tests/interop/<script> with Ruby and return the JSON it prints."""
    require_ruby()
    try:
        done = subprocess.run(["ruby", str(INTEROP / script), *argv],
                              capture_output=True, text=True, encoding="utf-8",
                              env=ruby_env(redis_url), timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"ruby {script} {argv} ran over {timeout}s: {exc.stderr!r}") from None
    if done.returncode != 0:
        raise AssertionError(f"ruby {script} {argv} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


# -- a Ruby Sidekiq server ---------------------------------------------------
@dataclasses.dataclass
class RubySidekiq:
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    identity: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text("utf-8", "replace")[-6000:]

    def registered(self, r: redis.Redis) -> str | None:
        """Its identity once its heartbeat is in Redis (it re-registers after a FLUSHALL)."""
        for member in r.smembers("processes"):
            name = str(member)
            if f":{self.pid}:" in name and r.hget(name, "info"):
                return name
        return None

    def wait_registered(self, r: redis.Redis, timeout: float = 10.0) -> str:
        try:
            self.identity = wait_for(lambda: self._alive() and self.registered(r), timeout,
                                     what="ruby sidekiq heartbeat")
        except AssertionError:
            raise AssertionError(f"ruby sidekiq never registered; its log:\n{self.log()}") \
                from None
        return self.identity

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ruby sidekiq exited {self.proc.returncode}:\n{self.log()}")
        return True

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log_file.close()


@contextmanager
def ruby_sidekiq(redis_server_url: str, r: redis.Redis, *options: str,
                 concurrency: int = 2) -> Iterator[RubySidekiq]:
    """``sidekiq -r tests/interop/worker.rb -q default -c 2 -t 1 [options]``, registered."""
    require_ruby()
    workdir = Path(tempfile.mkdtemp(prefix="wurk-interop-"))
    log_path = workdir / "sidekiq.log"
    log_file = log_path.open("wb")
    queues = () if "-q" in options else ("-q", "default")
    command = ["sidekiq", "-r", str(INTEROP / "worker.rb"), *queues, "-c", str(concurrency),
               "-t", "1", *options]
    proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                            env=ruby_env(redis_server_url), cwd=workdir)
    server = RubySidekiq(proc, log_path, log_file)
    try:
        server.wait_registered(r)
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# -- typed reads (the test client decodes replies to str) ---------------------
def list_items(r: redis.Redis, key: str) -> list[str]:
    return [str(item) for item in cast(list[Any], r.lrange(key, 0, -1))]


def zset_items(r: redis.Redis, key: str) -> list[tuple[str, float]]:
    """(member, score), lowest score first."""
    pairs = cast(list[tuple[Any, Any]], r.zrange(key, 0, -1, withscores=True))
    return [(str(member), float(score)) for member, score in pairs]


def zset_members(r: redis.Redis, key: str) -> list[str]:
    return [member for member, _ in zset_items(r, key)]


def hash_fields(r: redis.Redis, key: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in cast(dict[Any, Any], r.hgetall(key)).items()}


# -- recorded runs -------------------------------------------------------------
def runs(r: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in list_items(r, key)]


def wait_run(r: redis.Redis, key: str, jid: str, timeout: float = 10.0,
             count: int = 1) -> list[dict[str, Any]]:
    """The runs recorded for ``jid`` once there are ``count`` of them."""
    def found() -> list[dict[str, Any]] | None:
        mine = [run for run in runs(r, key) if run["jid"] == jid]
        return mine if len(mine) >= count else None

    result: list[dict[str, Any]] = wait_for(found, timeout, what=f"a run of {jid} in {key}")
    return result


# -- wurk side -------------------------------------------------------------------
def derive(config: Config, **changes: Any) -> Config:
    """A copy of the test config with some settings changed (its own pool)."""
    return dataclasses.replace(config, **changes)


@contextmanager
def closing_pool(config: Config) -> Iterator[Config]:
    """Close a derived config's Redis pool on the way out."""
    try:
        yield config
    finally:
        close_runtime(config)


@contextmanager
def launched(config: Config, **kwargs: Any) -> Iterator[Launcher]:
    launcher = Launcher(config, **kwargs)
    launcher.start()
    try:
        yield launcher
    finally:
        if not launcher.stopped.is_set():
            launcher.stop(time.monotonic() + 2)


class PyFailure(RuntimeError):
    """What PyFlaky and PyFail raise."""


@contextmanager
def python_jobs(config: Config) -> Iterator[threading.Event]:
    """Register PyEcho, PySlow, PyFlaky and PyFail (the wire names Ruby pushes).

    PySlow blocks until the yielded event is set (at most 20 s). Every run is
    recorded in ``interop:py-runs``.
    """
    pool = runtime_for(config).pool
    release = threading.Event()

    def record(job: wurk.Job, args: tuple[Any, ...], **extra: Any) -> None:
        entry = {"class": job.wurk_name, "jid": job.jid, "args": list(args),
                 "types": ruby_types(list(args)), "job": dict(job.payload),
                 "ran_at": time.time(), "pid": os.getpid(), **extra}
        pool.call("RPUSH", PY_RUNS, dumps(entry))

    class PyEcho(wurk.Job, name="PyEcho"):
        def perform(self, *args: Any) -> None:
            record(self, args)

    class PySlow(wurk.Job, name="PySlow"):
        def perform(self, *args: Any) -> None:
            record(self, args)
            release.wait(20)

    class PyFlaky(wurk.Job, name="PyFlaky", backtrace=True):
        def perform(self, *args: Any) -> None:
            attempt = int(pool.call("INCR", f"interop:attempts:{self.jid}"))
            if attempt == 1:
                raise PyFailure(f"flaky failure on attempt {attempt}")
            record(self, args, attempt=attempt)

    class PyFail(wurk.Job, name="PyFail", backtrace=True):
        def perform(self, *args: Any) -> None:
            raise PyFailure("python says no: é 日本")

    names = [PyEcho.wurk_name, PySlow.wurk_name, PyFlaky.wurk_name, PyFail.wurk_name]
    try:
        yield release
    finally:
        release.set()
        for name in names:
            registry.discard(name)

"""Shared fixtures: a real redis-server on a free port, flushed between tests."""

from __future__ import annotations

import gc
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_timeout
import redis
import structlog
from failure_logs import tails
from faultproxy import FaultProxy
from leaks import marking, survivors
from waiting import PATIENCE

import wurk
from wurk.core import logging as wlog
from wurk.push import nowhere
from wurk.push.job import JobFunction
from wurk.redis.runtime import close_runtime
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

# The shared helper modules assert on behalf of the tests that call them:
# pytest rewrites those asserts too, so a failure shows its values.
pytest.register_assert_rewrite("admin_cli", "cli_workers", "fetching", "pools", "swarms")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> object:
    """Stretch every test's hang guard by the suite's patience, as every wait is.

    A guard that does not stretch with the waits it surrounds fires on a
    loaded machine while each wait is still within its own deadline.
    """
    if not settings.timeout or PATIENCE == 1:
        return None
    stretched = settings._replace(timeout=settings.timeout * PATIENCE)
    return pytest_timeout.pytest_timeout_set_timer(item, stretched)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the tails of its processes' logs."""
    report = yield
    if report.when == "call" and report.failed:
        report.sections.extend(tails(item))
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen[bytes]
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def reap_probe_clients() -> None:
    """Collect the client ``start_redis`` pings with, which sits in a reference cycle.

    Left to a later gc run, its socket raises a ResourceWarning (an error in
    this suite) in whichever test happens to be running.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server)")
    return binary


def start_redis(*extra: str, port: int | None = None) -> RedisServer:
    binary = redis_server_binary()
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="wurk-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    server = RedisServer(port, proc, workdir)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with server.client() as probe:
                if probe.ping():
                    return server
        except redis.ConnectionError:
            time.sleep(0.02)
    server.stop()
    pytest.fail(f"redis-server did not start on port {port}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain redis-py client on the test server, flushed before each test."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def rb(redis_server: RedisServer, r: redis.Redis) -> Iterator[redis.Redis]:
    """A bytes client (no decoding) for byte-for-byte comparisons; ``r`` already flushed."""
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    yield client
    client.close()


@pytest.fixture
def config(redis_server: RedisServer, r: redis.Redis) -> Iterator[Config]:
    """A wurk config pointing at the test server, installed as the default."""
    cfg = Config(redis_url=redis_server.url, heartbeat_interval=0.2,
                 poll_interval_average=0.1, fetch_timeout=0.2, shutdown_timeout=2.0,
                 log_level="warning")
    wurk.configure(cfg)
    wurk.Client._default = None
    yield cfg
    close_runtime(cfg)
    close_runtime(wurk.default_config())  # a copy tuning.tuned installed, if any


@pytest.fixture
def launch_with() -> Iterator[Callable[..., Launcher]]:
    """Start in-process Launchers on a given config; stopped after the test."""
    started: list[Launcher] = []

    def start(config: Config, **kwargs: Any) -> Launcher:
        launcher = Launcher(config, **kwargs)
        started.append(launcher)
        launcher.start()
        return launcher

    yield start
    for launcher in started:
        if not launcher.stopped.is_set():
            launcher.stop(time.monotonic() + 1)


@pytest.fixture
def launch(config: Config, launch_with: Callable[..., Launcher]) -> Callable[..., Launcher]:
    """Start in-process Launchers on the installed default: the test config, or
    the copy a test installed with ``tuning.tuned``; stopped after the test."""
    return lambda **kwargs: launch_with(wurk.default_config(), **kwargs)


@pytest.fixture
def define() -> Iterator[Callable[..., JobFunction[..., Any]]]:
    """Register ``@wurk.job`` functions under unique names; forget them afterwards."""
    names: list[str] = []

    def register(fn: Callable[..., Any], **options: Any) -> JobFunction[..., Any]:
        name = f"t_{fn.__name__}_{uuid.uuid4().hex[:10]}"
        names.append(name)
        return wurk.job(name=name, **options)(fn)

    yield register
    for name in names:
        wurk.registry.discard(name)


@pytest.fixture(autouse=True)
def _no_process_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A process a test started and left running is killed, and the test errors.

    Set up before the test's other function fixtures, so it checks after all
    of them have torn down (and stopped what they started).
    """
    mark = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    with marking(mark):
        yield
    left = survivors(mark, grace=15 * PATIENCE)
    if left:
        pytest.fail(f"{request.node.nodeid} left {len(left)} process(es) running, "
                    f"now killed: {left}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WURK_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _own_spool(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test (and every process it starts) spools into its own directory,
    never into the user's ~/.local/state."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def _unwarned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process that has not yet warned of a push kept for a
    Redis that never answered, so no test depends on which ran before it."""
    monkeypatch.setattr(nowhere, "_warned_in", None)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that runs an entry point in process (``wurk.cli.main``) configures
    logging for the whole process; later tests must not inherit its level, its
    fast-path chain, or its pending lines."""
    saved = structlog.get_config()
    state = (wlog._threshold, wlog._entry_point, dict(wlog._process_fields))
    fast = (wlog._chain, wlog._renderer)
    yield
    # Its batched lines go out now, into this test's output, not a later test's.
    wlog.flush()
    structlog.configure(**saved)
    wlog._threshold, wlog._entry_point = state[0], state[1]
    wlog._process_fields.clear()
    wlog._process_fields.update(state[2])
    wlog._chain, wlog._renderer = fast


@pytest.fixture
def our_pipeline() -> None:
    """This process logs as a wurk entry point does (info, JSON lines);
    ``_logging_restored`` puts the test's logging back afterwards."""
    wlog.setup("info", "json")


def fill_to_maxmemory(client: redis.Redis) -> None:
    """Fill Redis (``noeviction``) until writes fail, then set maxmemory below
    what it holds, so that every write that may grow memory is refused."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 2_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(10_000):
            client.set(f"ballast:{i}", "x" * 10_000)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 100_000)


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, to fill up, stop or restart."""
    server = start_redis()
    reap_probe_clients()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def proxy(redis_server: RedisServer, r: redis.Redis) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the (flushed) test server (tests/faultproxy.py)."""
    reap_probe_clients()  # collected now, not mid-test
    fault_proxy = FaultProxy(redis_server.port)
    yield fault_proxy
    fault_proxy.close()

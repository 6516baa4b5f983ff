"""A real stack for the browser tests and scripts/screenshots.

``Stack`` starts, each as its own process: a redis-server on a free port,
a ``wurk-swarm`` of two children (slot ``slow``, whose job sleeps, so the
Busy page has wurk processes running a job), and ``wurk web --port 0`` (its
URL read from the line it prints). ``seed`` fills Redis first (tests/webpages.py).
``chromium()`` is Debian's browser, or None when it is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import redis
from conftest import RedisServer, start_redis
from leaks import unmarked_env
from webpages import seed

import wurk
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config

BIN = Path(sys.executable).parent
TOPOLOGY = textwrap.dedent("""
    [wurk]
    require = ["webjobs"]
    shutdown_timeout = 2
    heartbeat_interval = 1

    [[slot]]
    name = "slow"
    count = 2
    concurrency = 2
    queues = ["slow"]
""")
JOBS = textwrap.dedent("""
    import time
    import wurk

    @wurk.job(name="SlowReport")
    def slow(seconds):
        time.sleep(seconds)
""")


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Stack:
    def __init__(self, *, web_args: tuple[str, ...] = ()) -> None:
        self.web_args = web_args
        self.procs: list[subprocess.Popen[Any]] = []
        self.redis: RedisServer | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="wurk-web-"))

    def start(self) -> Stack:
        self.redis = start_redis()
        self.config = Config(redis_url=self.redis.url)
        try:
            self._start_processes()
        except BaseException:
            self.stop()  # nothing it started outlives a failed start
            raise
        return self

    def _start_processes(self) -> None:
        self.jids = seed(self.config)
        (self.workdir / "webjobs.py").write_text(JOBS)
        (self.workdir / "topology.toml").write_text(TOPOLOGY)
        env = {**os.environ, "PYTHONPATH": str(self.workdir), "REDIS_URL": self.redis.url}
        with open(self.workdir / "swarm.log", "wb") as log:
            self.worker = subprocess.Popen(
                [str(BIN / "wurk-swarm"), "--topology", str(self.workdir / "topology.toml")],
                env=env, stdout=log, stderr=log, cwd=self.workdir)
        self.procs.append(self.worker)
        client = wurk.Client(self.config)
        client.push({"class": "SlowReport", "queue": "slow", "args": [600]})
        client.push({"class": "SlowReport", "queue": "slow", "args": [0.05],
                     "profile": "nightly-report"})
        self.url = self.web(*self.web_args)

    def web(self, *args: str) -> str:
        """Start one more ``wurk web`` on this Redis; returns its URL."""
        assert self.redis is not None
        proc = subprocess.Popen(
            [str(BIN / "wurk"), "web", "--port", "0", "--poll", "1",
             "--redis-url", self.redis.url, *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=unmarked_env())  # the stack stops it, not the test that asked
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"(http://\S+/)", line)
        if not found:
            raise RuntimeError(f"wurk web did not start: {line!r}")
        return found.group(1).rstrip("/")

    def client(self) -> redis.Redis:
        assert self.redis is not None
        return self.redis.client()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
        close_runtime(self.config)
        if self.redis is not None:
            self.redis.stop()
            shutil.rmtree(self.redis.workdir, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def wait_until(predicate: Any, timeout: float = 20.0) -> Any:
    """Poll ``predicate`` (which may reload the page) until it is truthy.

    A reload that races a navigation the page is still making (a form just
    posted) fails with a Playwright error; that poll counts as not yet.
    """
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except PlaywrightError:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")

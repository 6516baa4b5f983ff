"""Sidekiq's Web UI (6.4.1, served by WEBrick through rackup) reading wurk.

A wurk launcher runs a long job and leaves retry, dead, scheduled and queued
entries; every page Sidekiq renders for them must answer 200 with wurk's
identity, jids and class names in it and no error text, and the UI's
buttons (Retry now, Quiet) must act on wurk.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.cookiejar import CookieJar
from pathlib import Path

import pytest
import redis
from conftest import RedisServer, free_port
from test_interop_support import (
    ARGS,
    INTEROP,
    PY_RUNS,
    closing_pool,
    derive,
    launched,
    private_redis,
    python_jobs,
    require_ruby,
    ruby_env,
    wait_run,
    zset_members,
)
from waiting import wait_for

import wurk
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

ERROR_TEXT = ("Internal Server Error", "NoMethodError", "undefined method", "TypeError",
              "ArgumentError", "ParserError", "Zlib::", "FloatDomainError", "invalid date")
SLOW_ARGS = ["é 日本 😀", {"n": 2**63 + 1}]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server (see private_redis)."""
    with private_redis() as server:
        yield server


def check_times(path: str, body: str) -> None:
    """Every time the page shows is within a day of now (a timestamp in the
    wrong unit shows as 1970 or as the year 58883)."""
    for stamp in re.findall(r'datetime="([^"]+)"', body):
        try:
            shown = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            shown = 0.0  # a year Python cannot even parse
        assert abs(shown - time.time()) < 86_400, f"GET {path} shows the time {stamp}"


@dataclass
class Web:
    base: str
    opener: urllib.request.OpenerDirector

    def get(self, path: str) -> str:
        """The page at ``path``; fails on any status but 200 or on error text."""
        try:
            with self.opener.open(self.base + path, timeout=10) as response:
                status, body = response.status, response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"GET {path}: {exc.code}\n{exc.read()[:3000]!r}") from None
        assert status == 200, path
        found = [text for text in ERROR_TEXT if text in body]
        assert not found, f"GET {path} shows {found}:\n{body[:3000]}"
        check_times(path, body)
        return html.unescape(body)

    def post(self, path: str, form_page: str, **fields: str) -> None:
        """Submit a form as the UI does, with the CSRF token from ``form_page``."""
        page = self.get(form_page)
        token = re.search(r"name='authenticity_token' value='([^']+)'", page)
        assert token, f"no CSRF token on {form_page}"
        data = urllib.parse.urlencode({"authenticity_token": token.group(1), **fields})
        with self.opener.open(self.base + path, data=data.encode(), timeout=10) as response:
            assert response.status == 200  # the redirect back to the list, followed


@pytest.fixture
def web(config: Config) -> Iterator[Web]:
    """Sidekiq::Web on 127.0.0.1 (WEBrick, via rackup) over the test Redis."""
    require_ruby()
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="wurk-web-"))
    log_path = workdir / "rack.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["rackup", "-s", "webrick", "-o", "127.0.0.1", "-p", str(port), "-E", "none",
             str(INTEROP / "config.ru")],
            stdout=log, stderr=subprocess.STDOUT, env=ruby_env(config.redis_url), cwd=workdir)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"rackup exited {proc.returncode}: {log_path.read_text()}")
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_for(up, timeout=15, what="Sidekiq::Web listening")
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        yield Web(f"http://127.0.0.1:{port}", opener)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log_path.unlink(missing_ok=True)
        workdir.rmdir()


@dataclass
class State:
    launcher: Launcher
    slow: str
    retry: str
    dead: str
    scheduled: str
    parked: str


@pytest.fixture
def wurk_state(config: Config, r: redis.Redis) -> Iterator[State]:
    """A live wurk process: one long job running, plus an entry in every set."""
    cfg = derive(config, tag="web-tag", labels=["py-label"], concurrency=3)
    with closing_pool(cfg), python_jobs(cfg) as release, launched(cfg) as launcher:
        client = wurk.Client(cfg)
        for n in range(3):
            client.push({"class": "PyEcho", "args": [n]})
        state = State(
            launcher=launcher,
            retry=client.push({"class": "PyFlaky", "args": ARGS}),
            dead=client.push({"class": "PyFail", "args": ["dies"], "retry": 0}),
            scheduled=client.push({"class": "PyEcho", "args": ["later"],
                                   "at": time.time() + 600}),
            parked=client.push({"class": "PyEcho", "args": ["parked"], "queue": "parked"}),
            slow=client.push({"class": "PySlow", "args": SLOW_ARGS}))
        wait_run(r, PY_RUNS, state.slow)
        wait_for(lambda: int(r.get("stat:processed") or 0) == 5
                 and r.hget(launcher.identity, "busy") == "1", what="wurk's heartbeat")
        yield state
        release.set()


def entry_key(page: str, section: str, jid: str) -> str:
    """The ``<score>-<jid>`` link Sidekiq built for an entry."""
    found = re.search(rf'href="/{section}/([0-9.e+]+-{jid})"', page)
    assert found, f"no /{section}/<score>-{jid} link"
    return found.group(1)


def test_sidekiq_web_pages_show_wurk(web: Web, wurk_state: State) -> None:
    state = wurk_state
    identity = state.launcher.identity
    today = datetime.now(UTC).strftime("%Y-%m-%d")

    stats = json.loads(web.get("/stats"))["sidekiq"]
    assert {k: stats[k] for k in ("processed", "failed", "busy", "processes", "enqueued",
                                  "scheduled", "retries", "dead")} == {
        "processed": 5, "failed": 2, "busy": 1, "processes": 1, "enqueued": 1,
        "scheduled": 1, "retries": 1, "dead": 1}
    dashboard = web.get("/")
    assert "Processed" in dashboard and "Dead" in dashboard

    busy = web.get("/busy")
    host_pid = f"{socket.gethostname()}:{os.getpid()}"
    for text in (identity, host_pid, "web-tag", "py-label", "PySlow", state.slow,
                 "é 日本 😀", str(2**63 + 1)):
        assert text in busy, text
    assert re.search(r"<td>\s*3\s*</td>\s*<td>\s*1\s*</td>", busy)  # threads, busy
    assert f'datetime="{today}' in busy  # started_at and run_at read as seconds

    queues = web.get("/queues")
    assert "parked" in queues and "default" in queues
    parked = web.get("/queues/parked")
    assert state.parked in parked and "PyEcho" in parked

    retries = web.get("/retries")
    assert state.retry in retries and "PyFlaky" in retries and "PyFailure" in retries
    retry = web.get(f"/retries/{entry_key(retries, 'retries', state.retry)}")
    for text in (state.retry, "PyFlaky", "PyFailure", "flaky failure on attempt 1",
                 "test_interop_support.py", "in `perform'"):  # backtrace lines, decoded
        assert text in retry, text
    assert f'datetime="{today}' in retry  # failed_at as a time today, not year 58883

    morgue = web.get("/morgue")
    assert state.dead in morgue and "PyFail" in morgue
    dead = web.get(f"/morgue/{entry_key(morgue, 'morgue', state.dead)}")
    assert state.dead in dead and "python says no: é 日本" in dead

    scheduled = web.get("/scheduled")
    assert state.scheduled in scheduled and "PyEcho" in scheduled
    web.get(f"/scheduled/{entry_key(scheduled, 'scheduled', state.scheduled)}")


def test_sidekiq_web_buttons_act_on_wurk(web: Web, wurk_state: State, r: redis.Redis) -> None:
    state = wurk_state
    key = entry_key(web.get("/retries"), "retries", state.retry)
    web.post(f"/retries/{key}", "/retries", retry="Retry Now")
    [run] = wait_run(r, PY_RUNS, state.retry)  # wurk ran it again, and it passed
    assert run["attempt"] == 2 and r.zcard("retry") == 0

    key = entry_key(web.get("/morgue"), "morgue", state.dead)
    web.post(f"/morgue/{key}", "/morgue", retry="Retry Now")

    def died_again() -> bool:  # wurk ran it once more; with retry 0 it went back to dead
        members = zset_members(r, "dead")
        return (int(r.get("stat:failed") or 0) == 3 and len(members) == 1
                and "retried_at" in json.loads(members[0]))

    wait_for(died_again, what="the retried dead job to die again on wurk")

    identity = state.launcher.identity
    web.post("/busy", "/busy", identity=identity, quiet="1")
    wait_for(lambda: r.hget(identity, "quiet") == "true", what="wurk quiet")
    assert state.launcher.manager.quieting
    assert '<span class="label label-danger">quiet</span>' in web.get("/busy")

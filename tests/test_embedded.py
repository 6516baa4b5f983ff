"""Embedded mode: worker threads inside the host process, no fork."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import redis

import wurk
from wurk.runtime.embedded import Embedded
from wurk.settings.config import Config

Define = Callable[..., Any]


def test_embedded_runs_jobs_in_this_process_and_drains_on_stop(
        r: redis.Redis, config: Config) -> None:
    ran: list[int] = []

    @wurk.job(name="EmbeddedEcho")
    def echo(n: int) -> None:
        ran.append(os.getpid())

    try:
        embedded = Embedded(config).start()
        assert embedded.launcher is not None
        identity = embedded.launcher.identity
        info = json.loads(r.hget(identity, "info") or "{}")
        assert info["embedded"] is True
        echo.perform_async(1)
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ran == [os.getpid()]
        embedded.stop()
        embedded.stop()  # idempotent
        assert identity not in r.smembers("processes")
    finally:
        wurk.registry.discard("EmbeddedEcho")


def test_embedded_stop_does_nothing_in_a_forked_child(r: redis.Redis, config: Config,
                                                     define: Define) -> None:
    define(lambda: None)  # a worker with no job would refuse to start
    embedded = Embedded(config).start()
    assert embedded.launcher is not None
    identity = embedded.launcher.identity
    pid = os.fork()
    if pid == 0:
        embedded.stop()
        os._exit(0 if embedded.launcher is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert identity in r.smembers("processes")  # the parent's worker is untouched
    embedded.stop()
    assert identity not in r.smembers("processes")

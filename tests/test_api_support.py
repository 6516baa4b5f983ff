"""Helpers shared by the admin API tests (no tests of its own).

Builds Redis state the way Ruby Sidekiq writes it (spec §1, §9) and runs
real wurk launchers for the tests that need a live process.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

import wurk
from wurk.push.job import JobFunction, registry
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

# Observed 6.4 values (spec §1 and §9.2).
RUBY_JOB = ('{"retry":true,"queue":"default","class":"WurkEcho","args":[1,"two",{"three":3}],'
            '"jid":"f24f20b2e4a09e8a29747db5","created_at":1796022177.8188896,'
            '"enqueued_at":1796022177.8190498}')
RUBY_IDENTITY = "vm:6757:f5d39967576a"
RUBY_INFO = {"hostname": "vm", "started_at": 1796022187.704982, "pid": 6757, "tag": "mytag",
             "concurrency": 3, "queues": ["default", "other"], "labels": [],
             "identity": RUBY_IDENTITY}


def ruby_heartbeat(r: redis.Redis, identity: str, info: dict[str, Any], *, busy: int = 0,
                   quiet: str = "false", rss: int = 31180, extra: dict[str, Any] | None = None,
                   ttl_ms: int = 60_000) -> None:
    """The second heartbeat MULTI of spec §9.2, as 6.4 sends it."""
    fields: dict[Any, Any] = {"info": json.dumps(info), "busy": busy, "beat": repr(time.time()),
                              "quiet": quiet, "rss": rss, "rtt_us": 47, **(extra or {})}
    with r.pipeline(transaction=True) as pipe:
        pipe.sadd("processes", identity)
        pipe.hset(identity, mapping=fields)
        pipe.pexpire(identity, ttl_ms)
        pipe.execute()


def job_json(jid: str | None = None, **fields: Any) -> str:
    item = {"retry": True, "queue": "default", "class": "WurkEcho", "args": [1],
            "jid": jid or uuid.uuid4().hex[:24], "created_at": time.time(), **fields}
    return json.dumps(item, separators=(",", ":"))


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` on threads released together; their results in call order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return results


@contextmanager
def launched(config: Config, **kwargs: Any) -> Iterator[Launcher]:
    """A real launcher on ``config``, stopped (briefly) on the way out."""
    launcher = Launcher(config, **kwargs)
    launcher.start()
    try:
        yield launcher
    finally:
        if not launcher.stopped.is_set():
            launcher.stop(time.monotonic() + 1)


@contextmanager
def recording_job(block: threading.Event | None = None, fail_times: int = 0,
                  **options: Any) -> Iterator[tuple[JobFunction[..., Any], list[Any]]]:
    """A registered job that records its args (and waits on ``block`` if given).

    The first ``fail_times`` runs raise RuntimeError instead.
    """
    name = f"api_{uuid.uuid4().hex}"
    runs: list[Any] = []
    failures: list[Any] = []

    @wurk.job(name=name, **options)
    def record(*args: Any) -> None:
        if len(failures) < fail_times:
            failures.append(args)
            raise RuntimeError("failing on purpose")
        runs.append(args)
        if block is not None:
            block.wait(5)

    try:
        yield record, runs
    finally:
        if block is not None:
            block.set()
        registry.discard(name)

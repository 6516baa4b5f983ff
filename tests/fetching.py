"""Helpers for the reliable-fetch tests: hand-written payloads, private lists, gated jobs.

1. ``payload`` writes job JSON with odd spacing and non-ASCII text, so any
   re-serialisation shows in a byte-for-byte comparison.
2. ``wip``, ``private_lists``, ``fake_dead_owner`` and ``reliable`` name and
   fill a process's private lists (``wurk:wip:<identity>:<queue>``) and reach
   its ``ReliableFetch``.
3. ``Gate`` and ``launch_gated`` hold a running job until the test releases it;
   ``blocked_in_brpoplpush`` tells when the fetcher waits in Redis.
4. ``quiet_background`` leaves the fetcher alone in talking to Redis through a
   fault proxy.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from faultproxy import FaultProxy
from tuning import tuned

from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.runtime.reliable_fetch import ReliableFetch
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import new_jid

Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


def payload(cls: str, *args: Any, queue: str = "default", jid: str | None = None) -> bytes:
    """Hand-written JSON with odd spacing and non-ASCII text: any re-serialisation shows."""
    body = json.dumps({"class": cls, "args": list(args), "jid": jid or new_jid(),
                       "queue": queue, "retry": True, "note": "café ☕",
                       "created_at": 1700000000.5}, ensure_ascii=False)
    return body.replace(", ", ",  ", 1).encode()


def jid_of(raw: bytes) -> str:
    jid: str = json.loads(raw)["jid"]
    return jid


def wip(identity: str, queue: str) -> str:
    return keys.wip(identity, queue)


def private_lists(rb: redis.Redis, identity: str) -> list[bytes]:
    found: list[bytes] = list(rb.scan_iter(match=f"{keys.wip_prefix(identity)}*"))
    return found


def fake_dead_owner(rb: redis.Redis, identity: str, queue: str, *raws: bytes) -> None:
    """What a process leaves behind when it dies mid-job (its heartbeat long gone)."""
    for raw in raws:
        rb.lpush(wip(identity, queue), raw)
    rb.sadd(keys.WIP_OWNERS, identity)
    rb.sadd(keys.wip_queues(identity), queue)


def reliable(launcher: Launcher) -> ReliableFetch:
    fetch = launcher.manager.fetch
    assert isinstance(fetch, ReliableFetch)
    return fetch


def blocked_in_brpoplpush(r: redis.Redis) -> bool:
    # "cmd" is a connection's last command, blocked in it or long done: the
    # "b" flag says it is blocked now.
    return any(c.get("cmd") == "brpoplpush" and "b" in c.get("flags", "")
               for c in r.client_list())


class Gate:
    """A job body that records it started, then waits to be released (or
    ``hold`` seconds pass: a test that measures a stop against the job's
    length holds it far longer than the bound it asserts)."""

    def __init__(self, hold: float = 5.0) -> None:
        self.hold = hold
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.runs: list[str] = []

    def run(self, tag: str) -> None:
        self.runs.append(tag)
        self.started.set()
        try:
            self.release.wait(self.hold)
        finally:
            self.finished.set()


class Gated(NamedTuple):
    gate: Gate
    job: JobFunction[..., Any]
    raw: bytes
    launcher: Launcher


def launch_gated(rb: redis.Redis, define: Define, launch: Launch, tag: str,
                 hold: float = 5.0) -> Gated:
    """Queue one job that waits behind a :class:`Gate`, then start a launcher."""
    gate = Gate(hold)
    job = define(gate.run)
    raw = payload(job.name, tag)
    rb.lpush("queue:default", raw)
    return Gated(gate, job, raw, launch())


def quiet_background(config: Config, proxy: FaultProxy, **changes: Any) -> Config:
    """A copy of ``config`` (installed as the default) on which only the fetcher
    talks to Redis through the proxy once the process has booted."""
    quiet = {"redis_url": proxy.url, "concurrency": 1, "heartbeat_interval": 30.0,
             "poll_interval_average": 30.0}
    return tuned(config, **(quiet | changes))

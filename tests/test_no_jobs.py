"""A worker with no job of the application registered does not start (issue 25, item 6).

Such a worker would fetch every job of its queues and fail each one as
unknown. ``wurk run`` exits 78 (EX_CONFIG) with the ``launcher.no_jobs``
hint before it even waits for Redis; a swarm child exits EX_BOOT, so its
parent counts it toward ``boot_failure_limit`` and gives up instead of
respawning it for ever; an embedded worker's ``start`` raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis
import swarms
from cli_workers import REPO, Worker, jobs_dir, spawn  # noqa: F401 - fixtures
from conftest import RedisServer
from swarms import SwarmProcess, slot

from supervisor.exits import EX_BOOT
from wurk.cli import EX_CONFIG
from wurk.wire.payload import new_jid

launch = swarms.launch


def push_fragile(r: redis.Redis, queue: str = "default") -> list[bytes]:
    """Jobs a worker that failed them as unknown would once have destroyed."""
    raws = []
    for fields in ({"retry": False}, {"retry": 0}, {"retry": 0, "dead": False}):
        raw = json.dumps({"class": "Mailer::Deliver", "args": [1], "jid": new_jid(),
                          "queue": queue, **fields})
        r.lpush(f"queue:{queue}", raw)
        raws.append(raw.encode())
    r.sadd("queues", queue)
    return raws


def untouched(r: redis.Redis, queue: str, raws: list[bytes]) -> None:
    assert sorted(r.lrange(f"queue:{queue}", 0, -1)) == sorted(s.decode() for s in raws)
    assert (r.zcard("retry"), r.zcard("dead"), r.scard("processes")) == (0, 0, 0)


def test_wurk_run_with_no_jobs_exits_78_with_the_hint_and_touches_no_job(
        r: redis.Redis, spawn: Callable[..., Worker]) -> None:  # noqa: F811
    raws = push_fragile(r)
    worker = spawn("--log-level", "info")
    assert worker.wait(60) == EX_CONFIG, worker.stderr()
    [warned] = [e for e in worker.events() if e.get("event") == "launcher.no_jobs"]
    assert warned["level"] == "error" and "-r/--require" in warned["hint"]
    assert not [e for e in worker.events() if e.get("event") == "launcher.started"]
    untouched(r, "default", raws)


def test_wurk_run_refuses_before_it_waits_for_redis(
        spawn: Callable[..., Worker]) -> None:  # noqa: F811
    worker = spawn("--redis-url", "redis://127.0.0.1:1/0")
    assert worker.wait(60) == EX_CONFIG, worker.stderr()
    assert not [e for e in worker.events() if e.get("event") == "redis.unreachable"]


def test_a_swarm_slot_with_no_jobs_fails_to_boot_and_the_swarm_gives_up(
        launch: Callable[..., SwarmProcess], r: redis.Redis) -> None:
    raws = push_fragile(r, "qa")
    swarm = launch(slot("empty", concurrency=2, queues=["qa"]), require=[],
                   boot_failure_limit=2)
    assert swarm.wait_exit(60) == EX_BOOT
    failures = swarm.events("child.boot_failed", slot="empty")
    assert any("NoJobsError" in str(e.get("error")) for e in failures), failures
    assert swarm.events("launcher.no_jobs")
    assert swarm.events("swarm.giving_up", slot="empty")
    assert not swarm.ready()
    untouched(r, "qa", raws)


def test_an_embedded_worker_with_no_jobs_refuses_to_start(
        redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> None:
    raws = push_fragile(r)
    code = ("from wurk.runtime.embedded import Embedded\n"
            "from wurk.runtime.loading import NoJobsError\n"
            "from wurk.settings.config import Config\n"
            f"config = Config(redis_url={redis_server.url!r}, log_format='json')\n"
            "try:\n"
            "    Embedded(config).start()\n"
            "except NoJobsError as exc:\n"
            "    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "refused: no job class is registered: import the modules" in done.stdout
    untouched(r, "default", raws)

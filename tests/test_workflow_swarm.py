"""A workflow across a real swarm (two ``wurk-swarm`` children): SIGKILLs of a
child while a group of the workflow runs and while its merge step runs, and
a Redis crash and restart (from its fsync-always AOF) between; the workflow
still ends once, the merge gets every result, later steps run once."""

from __future__ import annotations

import importlib
import json
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import swarms
from conftest import RedisServer
from swarms import Launch, slot
from waiting import wait_for

import wurk
from wurk.push.client import Client
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config
from wurk.workflows import keys as wire

launch = swarms.launch
SHARDS = 200

WF_JOBS = swarms.PER_PID_REDIS + textwrap.dedent("""
    import time

    import wurk


    def gate(name):
        for _ in range(2000):
            if r().exists(name):
                return
            time.sleep(0.005)


    @wurk.job(name="wf_fetch", queue="wq")
    def fetch(count):
        return list(range(count))


    @wurk.job(name="wf_parse", queue="wq")
    def parse(shard):
        r().incr("wf:started")
        gate("wf:go")
        r().incr("wf:parsed")
        return shard * 2


    @wurk.job(name="wf_merge", queue="wq")
    def merge(parts):
        r().incr("wf:merge-started")
        r().set("wf:merge-running", os.getpid())
        gate("wf:go-merge")
        r().incr("wf:merged")
        return sum(parts)


    @wurk.job(name="wf_notify", queue="wq")
    def notify(total):
        r().incr("wf:notified")
        r().set("wf:total", total)
""")


redis_server = swarms.aof_redis_server
restart = swarms.restart_from_aof


@pytest.fixture
def client(redis_server: RedisServer, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """A client of the test's server, with the jobs registered in this process too."""
    (tmp_path / "wf_jobs.py").write_text(WF_JOBS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TEST_REDIS_URL", redis_server.url)
    importlib.import_module("wf_jobs")
    config = Config(redis_url=redis_server.url, log_level="warning")
    yield Client(config, drain_spool=False)
    close_runtime(config)


def test_a_workflow_ends_once_through_sigkills_and_a_redis_restart(
        launch: Launch, tmp_path: Path, redis_server: RedisServer, r: redis.Redis,
        client: Client) -> None:
    flow = (wurk.step("wf_fetch", SHARDS, name="fetch")
            >> wurk.group("wf_parse", [[i] for i in range(SHARDS)], name="parse")
            >> wurk.step("wf_merge", name="merge", results=True)
            >> wurk.step("wf_notify", name="notify", results=True))
    wid = wurk.Workflow(flow, description="import", queue="wq", client=client).start()
    swarm = launch(slot("w", count=2, concurrency=8, queues=["wq"]),
                   require=["swarm_jobs", "wf_jobs"], poll_interval_average=0.2,
                   log_level="warning", layout={"w": 2})
    swarm.wait_ready()
    # Every thread of both children holds a parse job: kill one child mid-group.
    wait_for(lambda: int(r.get("wf:started") or 0) >= 16, timeout=20)
    os.kill(swarm.pid_at(("w", 0)), signal.SIGKILL)
    restart(redis_server)
    wait_for(lambda: r.set("wf:go", 1), timeout=10, ignoring=(redis.ConnectionError,))
    # The merge step runs (gated): kill whichever child holds it.
    wait_for(lambda: r.get("wf:merge-running") is not None, timeout=50, what="merge started",
             ignoring=(redis.ConnectionError,))
    os.kill(int(r.get("wf:merge-running") or 0), signal.SIGKILL)
    r.set("wf:go-merge", 1)
    wait_for(lambda: r.hget(wire.key(wid), "state") == "succeeded", timeout=50,
             what="the workflow succeeded")
    status = wurk.Workflow.status(wid, client=client)
    assert [s.state for s in status.steps.values()] == ["succeeded"] * 4
    assert r.get("wf:merged") == "1" and r.get("wf:notified") == "1"
    # The kills hit: the killed child's parse jobs and the merge ran again.
    assert int(r.get("wf:started") or 0) > SHARDS and r.get("wf:merge-started") == "2"
    assert r.get("wf:total") == str(sum(i * 2 for i in range(SHARDS)))
    assert r.hlen(wire.key(wid, "ends")) == 4
    assert json.loads(r.hget(wire.key(wid, "jids"), "parse") or "[]").__len__() == SHARDS
    assert swarm.proc.poll() is None

"""The push spool: what a process could not push before it exited is pushed
later, by another process, once each and in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from tests.conftest import RedisServer, free_port, start_redis
from tests.faultproxy import FaultProxy
from tests.swarms import launch as swarm_launch  # noqa: F401 - a fixture, by that name
from tests.swarms import push, slot
from tests.waiting import wait_for
from wurk.push import spool
from wurk.push.client import Client
from wurk.push.spool_drain import drain_once
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

REPO = Path(__file__).resolve().parent.parent
QUEUE = "spooled"
# These tests push to a Redis that never answered on purpose (its buffering is
# what they test); tests/test_push_nowhere.py covers the warning that says so.
pytestmark = pytest.mark.filterwarnings("ignore::wurk.PushSpooledWarning")

# Enqueue while Redis cannot take writes, print the jids, exit.
ENQUEUE = """
import json, sys
from wurk.core import logging as wlog
from wurk.push.client import Client
from wurk.settings.config import Config

wlog.setup("info", "json")
client = Client(Config(redis_url=sys.argv[1], redis_connect_timeout=0.2,
                       redis_retry_attempts=1, push_flush_timeout=0.5))
jids = [client.push({"class": "Echo", "args": [i], "queue": "spooled"}) for i in range(20)]
jids += client.push_bulk({"class": "Echo", "args": [[i] for i in range(20, 30)],
                          "queue": "spooled"})
print(json.dumps(jids))
"""


def spool_home() -> Path:
    """The default spool directory (conftest gives each test its own XDG_STATE_HOME)."""
    return Path(os.environ["XDG_STATE_HOME"]) / "wurk" / "spool"


def python(code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def log_events(stream: str, event: str) -> list[dict[str, object]]:
    found = []
    for line in stream.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == event:
            found.append(doc)
    return found


def queued(r: redis.Redis, queue: str = QUEUE) -> list[str]:
    """Jids on ``queue``, oldest (next to run) first."""
    return [json.loads(raw)["jid"] for raw in reversed(r.lrange(f"queue:{queue}", 0, -1))]


def make_entries(count: int, *, queue: str = QUEUE, per_push: int = 1) -> list[spool.SpoolEntry]:
    entries = []
    nonce = ""
    for i in range(count):
        if i % per_push == 0:
            nonce = os.urandom(8).hex()
        jid = new_jid()
        job = json.dumps({"class": "Echo", "args": [i], "queue": queue, "jid": jid})
        entries.append(spool.SpoolEntry(nonce, jid, queue, None, job))
    return entries


def write_file(config: Config, entries: list[spool.SpoolEntry]) -> Path:
    return spool.write_spool(spool.spool_dir(config), spool.target_of(config), entries)



@pytest.fixture
def cfg(redis_server: RedisServer, r: redis.Redis) -> Iterator[Config]:
    config = Config(redis_url=redis_server.url, log_level="warning")
    yield config
    close_runtime(config)


# -- exit: spool, not lose ----------------------------------------------------------
def test_pushes_left_at_exit_while_redis_is_down_are_spooled_then_pushed_by_a_worker(
        redis_server: RedisServer) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    done = python(ENQUEUE, url)
    assert done.returncode == 0, done.stderr
    jids = json.loads(done.stdout)
    spooled = log_events(done.stderr, "push.spooled")
    assert spooled and spooled[0]["level"] == "error" and spooled[0]["jobs"] == 30
    path = Path(str(spooled[0]["path"]))
    assert path.parent == spool_home() and path.exists()
    assert path.read_text().count("\n") == 31  # the header and one line per job
    server = start_redis(port=port)
    worker = subprocess.Popen(
        [sys.executable, "-m", "wurk.cli", "run", "-r", "bench.chaos_jobs", "-q", "elsewhere",
         "-c", "1"], cwd=REPO,
        env={**os.environ, "REDIS_URL": url}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        with server.client() as r:
            wait_for(lambda: not path.exists() and r.llen(f"queue:{QUEUE}") == 30,
                     timeout=30, what="the worker pushed the spool")
            assert queued(r) == jids  # once each, in order, with their jids
            # The claimed copy is deleted just after its jobs landed.
            wait_for(lambda: list(spool_home().iterdir()) == [], timeout=10,
                     what="the claimed spool file deleted")
    finally:
        worker.terminate()
        worker.wait(15)
        server.stop()


def test_a_pusher_exiting_while_the_primary_refuses_writes_spools_and_a_client_pushes_later(
        own_redis: RedisServer) -> None:
    """As the new primary of a Sentinel failover with min-replicas-to-write:
    NOREPLICAS until a replica joins, longer than the exit flush."""
    with own_redis.client() as r:
        r.config_set("min-replicas-to-write", 1)
        done = python(ENQUEUE, own_redis.url)
        assert done.returncode == 0, done.stderr
        jids = json.loads(done.stdout)
        assert r.llen(f"queue:{QUEUE}") == 0
        assert log_events(done.stderr, "push.spooled")[0]["jobs"] == 30
        r.config_set("min-replicas-to-write", 0)
        client = Client(Config(redis_url=own_redis.url, log_level="warning"))
        try:
            wait_for(lambda: r.llen(f"queue:{QUEUE}") == 30 and not any(spool_home().iterdir()),
                     what="the client pushed the spool at its start")
            assert queued(r) == jids
        finally:
            close_runtime(client.config)


# -- several drainers, crashes -----------------------------------------------------
DRAIN = """
import json, sys
from wurk.settings.config import Config
from wurk.push.spool_drain import drain_once
from wurk.redis.runtime import runtime_for
config = Config(redis_url=sys.argv[1])
report = drain_once(config, runtime_for(config).pool)
print(json.dumps({"pushed": len(report.pushed), "busy": len(report.busy)}))
"""


def test_two_processes_draining_one_spool_push_each_job_once(
        cfg: Config, r: redis.Redis, redis_server: RedisServer) -> None:
    files = [make_entries(40, per_push=8) for _ in range(16)]
    for entries in files:
        write_file(cfg, entries)
    drainers = [subprocess.Popen([sys.executable, "-c", DRAIN, redis_server.url], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    reports = [json.loads(d.communicate(timeout=30)[0].splitlines()[-1]) for d in drainers]
    assert sum(report["pushed"] for report in reports) == 16
    expected = [e.jid for entries in files for e in entries]
    assert sorted(queued(r)) == sorted(expected) and len(queued(r)) == 640
    assert list(spool.spool_dir(cfg).iterdir()) == []


# Drain with one job per script call, and die right after the k-th call.
DIE_AFTER = """
import os, sys
from wurk.push import confirmed, spool_drain
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
spool_drain.BATCH = 1
write, calls = confirmed.ConfirmedWriter.write, [0]
def dying_write(self, pool, push, **kw):
    write(self, pool, push, **kw)
    calls[0] += 1
    if calls[0] == int(sys.argv[2]):
        os._exit(9)
confirmed.ConfirmedWriter.write = dying_write
config = Config(redis_url=sys.argv[1])
spool_drain.drain_once(config, runtime_for(config).pool)
"""


@pytest.mark.parametrize("killed_after", [4, 12])
def test_a_drain_killed_mid_file_is_taken_over_and_pushes_each_job_once(
        cfg: Config, r: redis.Redis, redis_server: RedisServer, killed_after: int) -> None:
    entries = make_entries(12, per_push=3)
    path = write_file(cfg, entries)
    died = python(DIE_AFTER, redis_server.url, str(killed_after))
    assert died.returncode == 9, died.stderr
    assert len(queued(r)) == killed_after
    claimed = [name for name in spool.spool_files(path.parent) if name.claimer is not None]
    assert len(claimed) == 1  # the dead drainer's claim, left behind
    report = drain_once(cfg, runtime_for(cfg).pool)
    assert len(report.pushed) == 1
    assert queued(r) == [e.jid for e in entries]  # no job twice, none missing, in order
    assert list(path.parent.iterdir()) == []


def test_a_file_held_by_a_live_drainer_is_left_to_it(cfg: Config, r: redis.Redis) -> None:
    write_file(cfg, make_entries(3))
    [name] = spool.spool_files(spool.spool_dir(cfg))
    held = spool.claim(name)
    assert held is not None
    try:
        report = drain_once(cfg, runtime_for(cfg).pool)
        assert report.busy and not report.pushed and r.llen(f"queue:{QUEUE}") == 0
    finally:
        held.release()
    assert [f.state for f in spool.spool_files(spool.spool_dir(cfg))] == ["waiting"]
    assert len(drain_once(cfg, runtime_for(cfg).pool).pushed) == 1
    assert r.llen(f"queue:{QUEUE}") == 3


# -- untrusted files -----------------------------------------------------------------
def _header(jobs: int) -> str:
    return json.dumps({"wurk_spool": 1, "target": "redis://127.0.0.1:1/0", "pid": 1,
                       "written_at": time.time(), "jobs": jobs}) + "\n"


def _line(entry: spool.SpoolEntry, **changes: object) -> str:
    doc = {"nonce": entry.nonce, "jid": entry.jid, "queue": entry.queue, "at": entry.at,
           "job": entry.job, **changes}
    return json.dumps(doc) + "\n"


def _bad_contents(entry: spool.SpoolEntry) -> dict[str, bytes]:
    good = _line(entry)
    return {
        "empty": b"",
        "binary": b"\x00\xff\xfe garbage \x80\n",
        "not a header": b"[1, 2, 3]\n" + good.encode(),
        "not json": (_header(2) + good + "this is not json\n").encode(),
        "cut short": (_header(1) + good[:-20]).encode(),
        "fewer jobs than the header says": (_header(3) + good).encode(),
        "not a job": (_header(1) + _line(entry, job='{"hello": "world"}')).encode(),
        "a job with another jid": (_header(1) + _line(entry, jid="other")).encode(),
        "a bad nonce": (_header(1) + _line(entry, nonce="../../etc")).encode(),
        "a bad time": (_header(1) + _line(entry, at="soon")).encode(),
        "a time no clock reaches": (_header(1) + _line(entry, at=1e300)).encode(),
        "a time past any float": (_header(1) + _line(entry, at=10**400)).encode(),
        "a huge line": (_header(1) + _line(entry, pad="x" * 5000)).encode(),
        "deep nesting": (_header(1) + "[" * 100_000 + "\n").encode(),
    }


@pytest.mark.parametrize("flaw", list(_bad_contents(make_entries(1)[0])))
def test_a_bad_spool_file_is_moved_aside_and_reported_and_the_rest_is_pushed(
        cfg: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, flaw: str) -> None:
    monkeypatch.setattr(spool, "LINE_MAX", 4096)
    bad_entry = make_entries(1)[0]
    directory = spool.spool_dir(cfg)
    directory.mkdir(parents=True)
    bad = directory / f"{time.time_ns():020d}-1-abcdef.spool"
    bad.write_bytes(_bad_contents(bad_entry)[flaw])
    good = make_entries(5)
    write_file(cfg, good)
    with capture_logs() as logs:
        report = drain_once(cfg, runtime_for(cfg).pool, any_target=True)
    assert [path for path, _ in report.bad] == [str(bad.with_suffix(".spool.bad"))]
    assert bad.with_suffix(".spool.bad").exists() and not bad.exists()
    [line] = [e for e in logs if e["event"] == "spool.bad"]
    assert line["log_level"] == "error" and line["path"].endswith(".spool.bad")
    assert queued(r) == [e.jid for e in good]  # nothing from the bad file
    with capture_logs() as again:
        drain_once(cfg, runtime_for(cfg).pool)
    assert not [e for e in again if e["event"] == "spool.bad"]  # reported once, no loop


def test_a_file_for_another_redis_is_left_alone(cfg: Config, r: redis.Redis) -> None:
    other = Config(redis_url="redis://10.9.9.9:6380/3", spool_dir=str(spool.spool_dir(cfg)))
    write_file(other, make_entries(2))
    report = drain_once(cfg, runtime_for(cfg).pool)
    assert len(report.other_target) == 1 and r.llen(f"queue:{QUEUE}") == 0
    assert [f.state for f in spool.spool_files(spool.spool_dir(cfg))] == ["waiting"]
    assert len(drain_once(cfg, runtime_for(cfg).pool, any_target=True).pushed) == 1
    assert r.llen(f"queue:{QUEUE}") == 2


# -- periodic drain ------------------------------------------------------------------
def test_a_running_worker_pushes_a_spool_file_that_appears_later(
        redis_server: RedisServer, r: redis.Redis) -> None:
    config = Config(redis_url=redis_server.url, spool_interval=0.2, queues=["elsewhere"],
                    heartbeat_interval=0.2, fetch_timeout=0.2, log_level="warning")
    launcher = Launcher(config)
    launcher.start()
    try:
        wait_for(lambda: launcher.spool.passes >= 1, what="the drain at start")
        entries = make_entries(7)
        path = write_file(config, entries)
        wait_for(lambda: r.llen(f"queue:{QUEUE}") == 7 and not path.exists(),
                 what="the running worker pushed the new spool file")
        assert queued(r) == [e.jid for e in entries]
    finally:
        launcher.stop(time.monotonic() + 1)
        close_runtime(config)


# -- swarm children leave with os._exit ---------------------------------------------
SPOOL_JOBS = """
import wurk
from wurk.push.client import Client
from wurk.settings.config import Config


@wurk.job(name="push_elsewhere")
def push_elsewhere(url, count):
    client = Client(Config(redis_url=url, redis_connect_timeout=0.2, redis_retry_attempts=1,
                           push_flush_timeout=0.5))
    for i in range(count):
        client.push({"class": "Echo", "args": [i], "queue": "spooled"})
"""


def test_a_swarm_child_spools_what_its_jobs_could_not_push_when_it_exits(
        swarm_launch: Any, tmp_path: Path, r: redis.Redis) -> None:  # noqa: F811
    (tmp_path / "spool_jobs.py").write_text(SPOOL_JOBS, encoding="utf-8")
    swarm = swarm_launch(slot("alpha", count=1, concurrency=1, queues=["qa"]),
                         layout={"alpha": 1}, require=["swarm_jobs", "spool_jobs"])
    swarm.wait_ready()
    closed = f"redis://127.0.0.1:{free_port()}/0"
    push(r, "qa", "push_elsewhere", closed, 6)
    wait_for(lambda: swarm.events("push.buffered"), what="the job's pushes were buffered")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(20) == 0
    [spooled] = swarm.events("push.spooled")
    assert spooled["level"] == "error" and spooled["jobs"] == 6
    [name] = spool.spool_files(spool_home())
    assert str(name.path) == spooled["path"]


# -- in-process exit path -----------------------------------------------------------
def closed_client(**settings: Any) -> Client:
    return Client(Config(redis_url=f"redis://127.0.0.1:{free_port()}/0",
                         redis_connect_timeout=0.2, redis_retry_attempts=1,
                         push_flush_timeout=0.2, **settings), drain_spool=False)


def test_a_scheduled_push_keeps_its_time_through_the_spool(
        cfg: Config, r: redis.Redis) -> None:
    client = closed_client(spool_dir=str(spool.spool_dir(cfg)))
    at = time.time() + 600
    jid = client.push({"class": "Echo", "args": [1], "queue": QUEUE, "at": at})
    assert client.buffer is not None
    with capture_logs() as logs:
        client.buffer.flush_at_exit()
    assert [e["jobs"] for e in logs if e["event"] == "push.spooled"] == [1]
    assert len(drain_once(cfg, runtime_for(cfg).pool, any_target=True).pushed) == 1
    [(raw, score)] = r.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(raw)["jid"] == jid and abs(score - at) < 0.01


def test_a_spool_that_cannot_be_written_is_reported_as_lost_not_raised(
        tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    client = closed_client(spool_dir=str(blocker / "spool"))
    jids = [client.push({"class": "Echo", "args": [i]}) for i in range(3)]
    assert client.buffer is not None
    with capture_logs() as logs:
        client.buffer.flush_at_exit()
    events = {e["event"]: e for e in logs}
    assert "push.spool_failed" in events
    assert events["push.unflushed"]["jids"] == jids
    assert events["push.unflushed"]["log_level"] == "error"


def test_a_send_in_flight_at_exit_is_waited_for_and_not_spooled_too(
        cfg: Config, r: redis.Redis, redis_server: RedisServer) -> None:
    proxy = FaultProxy(redis_server.port)
    try:
        client = Client(Config(redis_url=proxy.url, redis_connect_timeout=0.2,
                               redis_retry_attempts=1, push_flush_timeout=0.1,
                               log_level="warning"), drain_spool=False)
        proxy.refuse()
        jids = [client.push({"class": "Echo", "args": [i], "queue": QUEUE}) for i in range(5)]
        proxy.heal()
        proxy.delay(0.8)
        # The drainer's first push reached Redis; its reply is held back.
        wait_for(lambda: r.llen(f"queue:{QUEUE}") == 1, what="a push in flight")
        assert client.buffer is not None
        with capture_logs() as logs:
            client.buffer.flush_at_exit()
        assert [e["jids"] for e in logs if e["event"] == "push.spooled"] == [jids[1:]]
        proxy.heal()
        drain_once(cfg, runtime_for(cfg).pool, any_target=True)
        assert queued(r) == jids
    finally:
        proxy.close()

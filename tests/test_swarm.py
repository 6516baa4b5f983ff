"""``wurk-swarm`` end to end: a real parent process, real forks, real redis-server.

Every test runs the swarm as a subprocess in its own session, reads its
JSON-lines stderr from a file, finds children with psutil and sees them as
Sidekiq does (the ``processes`` set and each identity hash). The fixture
kills the whole process group afterwards, so nothing outlives a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import structlog.testing
from conftest import RedisServer, start_redis
from waiting import wait_for

from supervisor.exits import EX_BOOT
from supervisor.swarm import Child, Swarm
from supervisor.systemd import Notifier
from supervisor.topology import parse
from wurk.redis.pools import close_pool
from wurk.runtime.reaper import recover
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
Key = tuple[str, int]

JOBS_MODULE = textwrap.dedent("""
    import os
    import time

    import redis

    import wurk

    _clients = {}


    def r():
        # One client per process: never a connection made before a fork.
        pid = os.getpid()
        if pid not in _clients:
            _clients[pid] = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
        return _clients[pid]


    @wurk.job(name="record")
    def record(tag):
        r().rpush("done", f"{tag}:{os.getpid()}")


    @wurk.job(name="slow_incr")
    def slow_incr(key, seconds):
        r().rpush("started", f"{key}:{os.getpid()}")
        time.sleep(seconds)
        r().incr(key)


    @wurk.job(name="hog")
    def hog(megabytes, seconds):
        ballast = b"x" * (megabytes * 1024 * 1024)  # written, so it counts in RSS
        r().rpush("hogging", os.getpid())
        time.sleep(seconds)
        return len(ballast)
""")

BASE_SETTINGS: dict[str, Any] = {
    "require": ["swarm_jobs"],
    "log_level": "info",
    "log_format": "json",
    "heartbeat_interval": 0.5,
    "fetch_timeout": 0.5,
    "shutdown_timeout": 2,
    "shutdown_grace": 2,
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def slot(name: str, **settings: Any) -> str:
    lines = ["[[slot]]", f"name = {toml_value(name)}"]
    lines += [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def push(r: redis.Redis, queue: str, cls: str, *args: Any) -> str:
    jid = new_jid()
    now = time.time()
    payload = {"class": cls, "args": list(args), "queue": queue, "jid": jid, "retry": False,
               "created_at": now, "enqueued_at": now}
    r.sadd("queues", queue)
    r.lpush(f"queue:{queue}", json.dumps(payload))
    return jid


def queued_jids(r: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["jid"] for raw in r.lrange(f"queue:{queue}", 0, -1)]


def gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs nothing any more)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@dataclass
class SwarmProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    r: redis.Redis
    layout: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def events(self, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
        needle = f'"event": "{name}"'.encode() if name else b""
        found = []
        with self.log_path.open("rb") as fh:
            for line in fh:
                if needle not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if name is not None and event.get("event") != name:
                    continue
                if all(event.get(k) == v for k, v in match.items()):
                    found.append(event)
        return found

    def wait_events(self, name: str, count: int = 1, timeout: float = 10.0,
                    **match: Any) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            events = self.events(name, **match)
            return events if len(events) >= count else None
        return wait_for(enough, timeout, what=f"{count} x {name} {match}")  # type: ignore[no-any-return]

    def child_pids(self) -> set[int]:
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return set()
        return {c.pid for c in children if not gone(c.pid)}

    def ready(self) -> dict[Key, dict[str, Any]]:
        """(slot, index) -> info of each live child that is registered in ``processes``."""
        pids = self.child_pids()
        found: dict[Key, dict[str, Any]] = {}
        for identity in self.r.smembers("processes"):
            fields = self.r.hgetall(identity)
            if "info" not in fields:
                continue
            info = json.loads(fields["info"])
            if info.get("swarm_pid") != self.pid or info.get("pid") not in pids:
                continue
            info["hash"] = fields
            found[(info["slot"], info["index"])] = info
        return found

    def wait_ready(self, layout: dict[str, int] | None = None, timeout: float = 15.0,
                   not_pids: set[int] | None = None) -> dict[Key, dict[str, Any]]:
        """Wait until exactly the layout's children run and are registered."""
        layout = layout or self.layout
        expected = {(name, i) for name, n in layout.items() for i in range(n)}

        def check() -> dict[Key, dict[str, Any]] | None:
            ready = self.ready()
            if set(ready) != expected or len(self.child_pids()) != len(expected):
                return None
            if not_pids and any(info["pid"] in not_pids for info in ready.values()):
                return None
            return ready
        return wait_for(check, timeout, what=f"children {sorted(expected)} ready")  # type: ignore[no-any-return]

    def pid_at(self, key: Key) -> int:
        return int(self.ready()[key]["pid"])

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)


Launch = Callable[..., SwarmProcess]


@pytest.fixture
def launch(tmp_path: Path, redis_server: RedisServer, r: redis.Redis) -> Iterator[Launch]:
    started: list[SwarmProcess] = []
    (tmp_path / "swarm_jobs.py").write_text(JOBS_MODULE, encoding="utf-8")

    def start(*slots: str, env: dict[str, str] | None = None, script: Path | None = None,
              layout: dict[str, int] | None = None, **settings: Any) -> SwarmProcess:
        wurk = {"redis_url": redis_server.url, **BASE_SETTINGS, **settings}
        text = "[wurk]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in wurk.items())
        topology = tmp_path / f"topology-{len(started)}.toml"
        topology.write_text(text + "\n" + "\n".join(slots), encoding="utf-8")
        log_path = tmp_path / f"swarm-{len(started)}.log"
        child_env = {k: v for k, v in os.environ.items()
                     if not k.startswith(("WURK_", "NOTIFY_SOCKET", "WATCHDOG_"))}
        child_env.update({
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
            "TEST_REDIS_URL": redis_server.url,
            "REDIS_URL": redis_server.url,
            **(env or {}),
        })
        argv = ([sys.executable, str(script), str(topology)] if script else
                [sys.executable, "-m", "supervisor.cli", "--topology", str(topology)])
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=log_file, cwd=tmp_path, env=child_env,
                                    start_new_session=True)
        swarm = SwarmProcess(proc, log_path, r, layout or {})
        started.append(swarm)
        return swarm

    yield start
    for swarm in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(swarm.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            swarm.proc.wait(10)


# -- boot --------------------------------------------------------------------------

def test_two_slots_boot_their_children_and_jobs_flow_through_them(
        launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   slot("beta", concurrency=3, queues=["qb", "qc"]),
                   layout={"alpha": 2, "beta": 1})
    ready = swarm.wait_ready()

    assert swarm.child_pids() == {info["pid"] for info in ready.values()}
    for index in (0, 1):
        info = ready[("alpha", index)]
        assert (info["concurrency"], info["queues"]) == (2, ["qa"])
        assert info["hash"]["concurrency"] == "2"
    beta = ready[("beta", 0)]
    assert (beta["concurrency"], beta["queues"]) == (3, ["qb", "qc"])
    forked = swarm.wait_events("swarm.forked")[0]
    booted = swarm.wait_events("swarm.booted")[0]
    assert forked["children"] == 3 and booted["ready"] == 3
    names = [e["event"] for e in swarm.events()]
    # Booted means every child is ready, so it comes after the last child.ready.
    assert names.index("swarm.booted") > max(i for i, n in enumerate(names) if n == "child.ready")

    for n in range(10):
        push(r, "qa", "record", f"a{n}")
    for n in range(5):
        push(r, "qb" if n % 2 else "qc", "record", f"b{n}")
    done = wait_for(lambda: (d := r.lrange("done", 0, -1)) and len(d) >= 15 and d,
                    what="15 jobs done")
    alpha_pids = {ready[("alpha", i)]["pid"] for i in (0, 1)}
    for entry in done:
        tag, pid = entry.split(":")
        assert int(pid) in (alpha_pids if tag.startswith("a") else {beta["pid"]}), entry
    assert sorted(e.split(":")[0] for e in done) == sorted(
        [f"a{n}" for n in range(10)] + [f"b{n}" for n in range(5)])

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


# -- respawn and backoff -----------------------------------------------------------

def test_killed_child_is_respawned_in_its_slot_and_index_and_a_crash_loop_backs_off(
        launch: Launch) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1})
    before = swarm.wait_ready()
    victim = before[("alpha", 1)]["pid"]
    os.kill(victim, signal.SIGKILL)
    after = swarm.wait_ready(not_pids={victim})
    assert after[("alpha", 1)]["pid"] != victim
    # The others were left alone.
    assert after[("alpha", 0)]["pid"] == before[("alpha", 0)]["pid"]
    assert after[("beta", 0)]["pid"] == before[("beta", 0)]["pid"]
    killed = swarm.wait_events("child.killed", pid=victim)[0]
    assert (killed["slot"], killed["index"]) == ("alpha", 1)

    # Keep killing the same child as soon as it is back: the slot must slow down.
    for _ in range(2):
        victim = after[("alpha", 1)]["pid"]
        os.kill(victim, signal.SIGKILL)
        after = swarm.wait_ready(not_pids={victim})
    backoffs = swarm.wait_events("slot.backoff", count=3, slot="alpha")
    delays = [event["delay"] for event in backoffs]
    assert delays == sorted(delays)
    assert delays[0] < delays[1] < delays[2], delays
    assert [event["crashes"] for event in backoffs] == [1, 2, 3]
    # The delay was honoured, not only logged: the last respawn came after it.
    spawns = swarm.events("child.spawned", slot="alpha", index=1)
    exits = swarm.events("child.killed", slot="alpha", index=1)
    assert len(spawns) == 4 and len(exits) == 3
    last_gap = _ts(spawns[-1]) - _ts(exits[-1])
    assert last_gap >= delays[2] * 0.9, (last_gap, delays)
    assert swarm.proc.poll() is None


def test_child_killed_by_a_realtime_signal_is_respawned(launch: Launch) -> None:
    # Real-time signals have no signal.Signals member; describing the exit
    # must not take the supervise thread down.
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]), layout={"alpha": 1})
    victim = swarm.wait_ready()[("alpha", 0)]["pid"]
    signum = signal.SIGRTMIN + 6
    os.kill(victim, signum)
    swarm.wait_ready(not_pids={victim})
    exited = swarm.wait_events("child.exited", pid=victim)[0]
    assert exited["exit"] == f"signal {int(signum)}"
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_child_over_max_memory_is_replaced(launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"], max_memory_mb=0),
                   layout={"alpha": 1, "beta": 1},
                   max_memory_mb=80, memory_check_interval=0.5, shutdown_timeout=1)
    before = swarm.wait_ready()
    old = before[("alpha", 0)]["pid"]
    jid = push(r, "qa", "hog", 150, 20)

    event = swarm.wait_events("child.memory_exceeded", pid=old)[0]
    assert (event["slot"], event["index"], event["limit_mb"]) == ("alpha", 0, 80)
    assert event["rss_kb"] > 80 * 1024
    after = swarm.wait_ready(not_pids={old})
    assert after[("alpha", 0)]["pid"] != old
    assert after[("beta", 0)]["pid"] == before[("beta", 0)]["pid"]  # the unlimited slot
    assert gone(old)
    # The job it was running went back to the queue and the new child took it.
    new = after[("alpha", 0)]["pid"]
    wait_for(lambda: str(new) in r.lrange("hogging", 0, -1), what="hog re-run by the new child")
    requeued = swarm.events("shutdown.requeued")
    assert requeued and requeued[0]["jobs"] == 1
    assert len(swarm.events("job.start", jid=jid)) >= 2


# -- shutdown ----------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_term_lets_running_jobs_finish_and_exits_0(launch: Launch, r: redis.Redis,
                                                   signum: int) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   layout={"alpha": 2}, shutdown_timeout=5)
    ready = swarm.wait_ready()
    for _ in range(4):
        push(r, "qa", "slow_incr", "finished", 1.5)
    wait_for(lambda: r.llen("started") == 4, what="4 jobs started")
    pids = {info["pid"] for info in ready.values()}
    assert r.get("finished") is None

    swarm.send(signum)
    assert swarm.wait_exit(15) == 0
    assert r.get("finished") == "4"
    assert r.llen("queue:qa") == 0
    assert all(gone(pid) for pid in pids)
    assert r.smembers("processes") == set()
    assert swarm.events("swarm.drained")[0]["exit_code"] == 0


def test_term_pushes_back_jobs_that_outlive_the_timeout(launch: Launch,
                                                         r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   layout={"alpha": 2}, shutdown_timeout=1)
    ready = swarm.wait_ready()
    jids = {push(r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    wait_for(lambda: r.llen("started") == 2, what="2 jobs started")

    started = time.monotonic()
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(15) == 0
    assert time.monotonic() - started < 1 + 2  # timeout, then out; never the grace KILL
    assert set(queued_jids(r, "qa")) == jids
    assert r.get("never") is None
    assert all(gone(info["pid"]) for info in ready.values())
    assert sum(e["jobs"] for e in swarm.events("shutdown.requeued")) == 2


def test_killed_parent_takes_its_children_down_and_their_jobs_go_back(
        launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, shutdown_timeout=1)
    ready = swarm.wait_ready()
    pids = {info["pid"] for info in ready.values()}
    jids = {push(r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    jids_b = {push(r, "qb", "slow_incr", "never", 30)}
    wait_for(lambda: r.llen("started") == 3, what="3 jobs started")
    assert r.llen("queue:qa") == r.llen("queue:qb") == 0

    swarm.send(signal.SIGKILL)
    killed_at = time.monotonic()
    swarm.wait_exit(5)
    wait_for(lambda: all(gone(pid) for pid in pids), timeout=3, interval=0.02,
             what="every child gone within 3 s")
    assert time.monotonic() - killed_at < 3
    assert set(queued_jids(r, "qa")) == jids
    assert set(queued_jids(r, "qb")) == jids_b
    assert r.smembers("processes") == set()


# -- signals -----------------------------------------------------------------------

def test_ttin_and_ttou_change_the_number_of_children(launch: Launch) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]),
                   slot("beta", count=2, concurrency=1, queues=["qb"]),
                   layout={"alpha": 1, "beta": 2})
    first = swarm.wait_ready()

    swarm.send(signal.SIGTTIN)
    more = swarm.wait_ready({"alpha": 2, "beta": 3})
    for key, info in first.items():
        assert more[key]["pid"] == info["pid"]  # growing never touches running children

    swarm.send(signal.SIGTTOU)
    fewer = swarm.wait_ready({"alpha": 1, "beta": 2})
    assert {k: v["pid"] for k, v in fewer.items()} == {k: v["pid"] for k, v in first.items()}
    assert gone(more[("alpha", 1)]["pid"]) and gone(more[("beta", 2)]["pid"])

    swarm.send(signal.SIGTTOU)  # alpha is at one already and stays there
    swarm.wait_ready({"alpha": 1, "beta": 1})
    scale = swarm.wait_events("swarm.scale", count=3)
    assert scale[-1]["wanted"] == {"alpha": 1, "beta": 1}
    assert swarm.proc.poll() is None


def test_ttin_stops_at_each_slots_max_count(launch: Launch) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"], max_count=2),
                   slot("beta", count=2, concurrency=1, queues=["qb"]),
                   layout={"alpha": 1, "beta": 2}, max_count=3)
    swarm.wait_ready()
    for sent in range(1, 4):
        swarm.send(signal.SIGTTIN)  # one at a time: pending signals of a kind merge
        swarm.wait_events("swarm.scale", count=sent)
    swarm.wait_ready({"alpha": 2, "beta": 3})
    refused = swarm.events("swarm.scale_refused")
    assert [(e["slot"], e["wanted"], e["max_count"]) for e in refused] == [
        ("alpha", 2, 2), ("beta", 3, 3)] * 2
    assert swarm.events("swarm.scale")[-1]["wanted"] == {"alpha": 2, "beta": 3}
    time.sleep(1.0)  # a respawn pass or two: still no child beyond the cap
    swarm.wait_ready({"alpha": 2, "beta": 3}, timeout=1)
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1], ids=["HUP", "USR1"])
def test_rolling_restart_replaces_every_child_without_cutting_a_job(
        launch: Launch, r: redis.Redis, signum: int) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, shutdown_timeout=8)
    before = swarm.wait_ready()
    old_pids = {info["pid"] for info in before.values()}
    jid = push(r, "qa", "slow_incr", "counter", 3)
    wait_for(lambda: r.llen("started") == 1, what="the job started")

    swarm.send(signum)
    after = swarm.wait_ready(not_pids=old_pids, timeout=20)
    assert not old_pids & {info["pid"] for info in after.values()}
    assert set(after) == set(before)
    # The job was left to finish in its old child, which drained, then left.
    wait_for(lambda: r.get("counter") == "1", what="the job finished")
    wait_for(lambda: all(gone(pid) for pid in old_pids), what="old children gone")
    assert r.llen("started") == 1  # ran once, never re-run
    assert len(swarm.events("job.start", jid=jid)) == 1
    assert r.llen("queue:qa") == 0
    assert not swarm.events("shutdown.requeued")
    assert not swarm.events("child.kill")
    assert swarm.proc.poll() is None


def test_tstp_quiets_every_child(launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1})
    swarm.wait_ready()
    swarm.send(signal.SIGTSTP)

    def all_quiet() -> bool:
        ready = swarm.ready()
        return len(ready) == 3 and all(i["hash"]["quiet"] == "true" for i in ready.values())
    wait_for(all_quiet, what="every child quiet")
    # A fetch already blocked in BRPOP may still be waiting out its
    # fetch_timeout (0.5 s); after that nobody asks Redis for work.
    time.sleep(1.0)
    push(r, "qa", "record", "late-a")
    push(r, "qb", "record", "late-b")
    time.sleep(1.5)
    assert r.llen("queue:qa") == 1
    assert r.llen("queue:qb") == 1
    assert r.llen("done") == 0
    assert all_quiet()

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0
    assert r.llen("queue:qa") == r.llen("queue:qb") == 1


def test_usr2_logs_each_childs_status(launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, shutdown_timeout=1)
    swarm.wait_ready()
    push(r, "qb", "slow_incr", "never", 30)
    wait_for(lambda: swarm.ready()[("beta", 0)]["hash"]["busy"] == "1",
             what="beta busy in its heartbeat")
    swarm.send(signal.SIGUSR2)
    lines = swarm.wait_events("child.status", count=3)
    by_key = {(e["slot"], e["index"]): e for e in lines}
    ready = swarm.ready()
    assert set(by_key) == set(ready)
    for key, event in by_key.items():
        assert event["pid"] == ready[key]["pid"]
        assert event["rss_kb"] > 1000
        assert isinstance(event["age"], float | int) and event["age"] >= 0
        assert 0 <= event["silent"] < 5  # pulsed within a few 0.5 s heartbeats
    assert by_key[("beta", 0)]["busy"] == 1
    assert by_key[("alpha", 0)]["busy"] == 0


def test_usr2_survives_a_busy_count_that_is_not_a_number(launch: Launch,
                                                         r: redis.Redis) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]), layout={"alpha": 1})
    info = swarm.wait_ready()[("alpha", 0)]
    os.kill(info["pid"], signal.SIGSTOP)  # so its heartbeat cannot rewrite the field
    try:
        r.hset(info["identity"], "busy", "abc")
        swarm.send(signal.SIGUSR2)
        status = swarm.wait_events("child.status")[0]
    finally:
        os.kill(info["pid"], signal.SIGCONT)
    assert status["pid"] == info["pid"] and status["busy"] is None
    wait_for(lambda: r.hget(info["identity"], "busy") == "0", what="a beat rewrote busy")
    swarm.send(signal.SIGUSR2)  # the supervise loop is still there to answer
    assert swarm.wait_events("child.status", count=2)[1]["busy"] == 0
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_out_of_descriptors_a_spawn_backs_off_instead_of_killing_the_swarm(
        launch: Launch) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"], max_count=3),
                   layout={"alpha": 1})
    first = swarm.wait_ready()
    parent = psutil.Process(swarm.pid)
    _, hard = resource.prlimit(swarm.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(swarm.pid, resource.RLIMIT_NOFILE, (parent.num_fds() + 1, hard))
    swarm.send(signal.SIGTTIN)  # the next child's pipe needs two descriptors
    failed = swarm.wait_events("child.spawn_failed", count=2)
    assert failed[0]["slot"] == "alpha" and "Too many open files" in failed[0]["error"]
    assert swarm.proc.poll() is None
    resource.prlimit(swarm.pid, resource.RLIMIT_NOFILE, (4096, hard))
    after = swarm.wait_ready({"alpha": 2}, timeout=20)
    assert after[("alpha", 0)]["pid"] == first[("alpha", 0)]["pid"]
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_scaling_away_a_pending_replacement_stops_the_child_it_replaces(
        redis_server: RedisServer, r: redis.Redis) -> None:
    """TTOU during a rolling restart, before the replacement is ready: both go.

    In process, with ``sleep`` processes standing in for children, because
    the window (a replacement still booting) is too short to hit reliably
    from outside.
    """
    topology = parse({"wurk": {"redis_url": redis_server.url, "shutdown_timeout": 1},
                      "slot": [{"name": "a", "count": 2}]}, Path("unit.toml"))
    swarm = Swarm(topology, notifier=Notifier(None))
    a = topology.slots[0]
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        keep = Child(a, 0, procs[0].pid, None, identity="host:1:keep")
        old = Child(a, 1, procs[1].pid, None, identity="host:2:old", retiring=True)
        new = Child(a, 1, procs[2].pid, None)  # the rolling restart's, still booting
        swarm.children = {c.pid: c for c in (keep, old, new)}
        swarm.rolling.pair = (old, new)

        swarm._cmd_fewer()
        assert new.retiring and new.kill_at is not None

        def reaped(child: Child) -> bool:
            swarm._reap()
            return child.pid not in swarm.children
        wait_for(lambda: reaped(new), timeout=5, what="the replacement reaped")
        assert old.kill_at is not None  # asked to leave, not kept as an extra child
        wait_for(lambda: reaped(old), timeout=5, what="the old child reaped")
        assert swarm.children == {keep.pid: keep}
        assert not keep.retiring and keep.kill_at is None
        assert procs[0].poll() is None
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)
        os.close(swarm._wake_r)
        os.close(swarm._wake_w)


# -- boot failures -----------------------------------------------------------------

def test_boot_failing_after_some_forks_gives_up_and_leaves_no_child(
        launch: Launch, tmp_path: Path) -> None:
    (tmp_path / "module_that_raises.py").write_text(
        "raise RuntimeError('this slot cannot boot')\n", encoding="utf-8")
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("broken", concurrency=1, queues=["qb"],
                        require=["swarm_jobs", "module_that_raises"]),
                   boot_failure_limit=2, shutdown_timeout=1)
    code = swarm.wait_exit(30)
    assert code != 0
    giving_up = swarm.events("swarm.giving_up")
    assert giving_up and giving_up[0]["slot"] == "broken"
    failures = swarm.events("child.boot_failed", slot="broken")
    assert any("this slot cannot boot" in str(e.get("error")) for e in failures)
    spawned = swarm.events("child.spawned")
    assert {e["slot"] for e in spawned} == {"alpha", "broken"}
    assert all(gone(e["pid"]) for e in spawned)
    assert swarm.events("swarm.drained")


@pytest.mark.parametrize("module", [
    None,
    "import sys\nsys.exit(4)\n",
], ids=["missing-module", "sys-exit-at-import"])
def test_preload_failure_in_the_parent_forks_nothing(launch: Launch, tmp_path: Path,
                                                     module: str | None) -> None:
    if module is not None:
        (tmp_path / "bad_preload.py").write_text(module, encoding="utf-8")
    swarm = launch(slot("alpha", queues=["qa"]),
                   require=["bad_preload" if module else "no_such_module_anywhere"])
    assert swarm.wait_exit(30) == EX_BOOT  # promptly: never a hang
    failed = swarm.events("swarm.boot_failed")
    assert failed
    assert ("SystemExit" if module else "ModuleNotFoundError") in failed[0]["error"]
    assert not swarm.events("child.spawned")


# -- Redis outages ------------------------------------------------------------------

class Outage:
    """A redis-server of the test's own that goes away and comes back on its
    port with its data (AOF, fsync always)."""

    PERSIST = ("--appendonly", "yes", "--appendfsync", "always")

    def __init__(self) -> None:
        self.server = start_redis(*self.PERSIST)
        self.began = 0.0

    @property
    def url(self) -> str:
        return self.server.url

    def begin(self) -> None:
        self.server.stop()
        self.began = time.monotonic()

    def end(self) -> float:
        """Start Redis again; returns how long it was down."""
        workdir = self.server.workdir
        restarted = start_redis(*self.PERSIST, "--dir", workdir, port=self.server.port)
        shutil.rmtree(restarted.workdir, ignore_errors=True)
        self.server = RedisServer(restarted.port, restarted.proc, workdir)
        return time.monotonic() - self.began

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.server.workdir, ignore_errors=True)


@pytest.fixture
def outage() -> Iterator[Outage]:
    own = Outage()
    yield own
    own.close()


def launch_on(launch: Launch, outage: Outage, *slots: str, **settings: Any) -> SwarmProcess:
    env = {"REDIS_URL": outage.url, "TEST_REDIS_URL": outage.url}
    swarm = launch(*slots, env=env, redis_url=outage.url, **settings)
    swarm.r = outage.server.client()
    return swarm


def test_a_redis_outage_with_children_dying_does_not_stop_the_swarm(
        launch: Launch, outage: Outage) -> None:
    swarm = launch_on(launch, outage, slot("alpha", count=2, concurrency=1, queues=["qa"]),
                      layout={"alpha": 2}, boot_failure_limit=2, respawn_backoff_max=0.5)
    swarm.wait_ready()
    outage.begin()
    deaths = 3
    for death in range(1, deaths + 1):
        # Any child, a healthy one first, then replacements waiting for Redis.
        os.kill(max(swarm.child_pids()), signal.SIGKILL)
        swarm.wait_events("child.spawned", count=2 + death)
        swarm.wait_events("redis.unreachable", count=death)
    # Before: each replacement failed its start-up PING with exit 69, and two
    # of those made the swarm give up (exit 69), healthy child included.
    assert swarm.proc.poll() is None
    assert not swarm.events("swarm.giving_up")
    assert not swarm.events("child.boot_failed")
    down_for = outage.end()
    swarm.r = outage.server.client()
    swarm.wait_ready(timeout=20)
    push(swarm.r, "qa", "record", "after-the-outage")
    wait_for(lambda: swarm.r.llen("done") == 1, what="a job run after the outage")
    print(f"survived a {down_for:.1f} s Redis outage with {deaths} child deaths")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_a_drain_during_a_redis_outage_ends_on_time_with_exit_0(
        launch: Launch, outage: Outage) -> None:
    swarm = launch_on(launch, outage, slot("alpha", count=2, concurrency=1, queues=["qa"]),
                      layout={"alpha": 2}, shutdown_timeout=1, shutdown_grace=3)
    swarm.wait_ready()
    jids = {push(swarm.r, "qa", "slow_incr", "never", 30) for _ in range(2)}
    wait_for(lambda: swarm.r.llen("started") == 2, what="2 jobs started")
    outage.begin()
    started = time.monotonic()
    swarm.send(signal.SIGTERM)
    code = swarm.wait_exit(30)
    elapsed = time.monotonic() - started
    # Before: the children's Redis retries outlasted timeout + grace, the
    # parent KILLed them and exited 1.
    assert code == 0
    assert not swarm.events("child.kill")
    assert elapsed < 1 + 1 + 1.5, elapsed  # timeout, STOP_MARGIN, exit: never the grace
    outage.end()
    # Nothing lost: what could not be given back waits in its private list
    # until recovery (the reaper, or the next parent) returns it.
    client = outage.server.client()
    config = Config(redis_url=outage.url)
    try:
        for owner in client.smembers("wurk:wip:owners"):
            recover(config, owner)
    finally:
        close_pool(config)
    assert set(queued_jids(client, "qa")) == jids


def test_status_reads_busy_from_each_slots_own_redis(launch: Launch, r: redis.Redis) -> None:
    other = start_redis()
    try:
        r2 = other.client()
        swarm = launch(slot("alpha", concurrency=1, queues=["qa"]),
                       slot("beta", concurrency=1, queues=["qb"], redis_url=other.url),
                       shutdown_timeout=1)
        ready = swarm.wait_events("child.ready", count=2)
        push(r2, "qb", "slow_incr", "never", 30)
        beta = next(e for e in ready if e["slot"] == "beta")
        wait_for(lambda: r2.hget(beta["identity"], "busy") == "1", what="beta busy")
        assert r.hget(beta["identity"], "info") is None  # it beats in its own Redis only
        swarm.send(signal.SIGUSR2)
        lines = {e["slot"]: e for e in swarm.wait_events("child.status", count=2)}
        assert lines["beta"]["busy"] == 1
        assert lines["alpha"]["busy"] == 0
        swarm.send(signal.SIGTERM)
        assert swarm.wait_exit() == 0
        assert r2.llen("queue:qb") == 1  # pushed back to the slot's own Redis
        r2.close()
    finally:
        other.stop()


# -- fork safety -------------------------------------------------------------------

SPAMMY_PARENT = textwrap.dedent("""
    import sys
    import threading

    from supervisor.cli import run
    from supervisor.swarm import Swarm
    from supervisor.topology import load
    from wurk.core import logging as wlog

    topology = load(sys.argv[1])
    wlog.setup(topology.base.log_level, topology.base.log_format)
    log = wlog.get_logger("test.spam")


    def spam():
        n = 0
        while True:
            log.info("spam", n=n, pad="x" * 64)
            n += 1


    threading.Thread(target=spam, daemon=True).start()
    sys.exit(run(Swarm(topology)))
""")


def test_forking_while_the_parent_logs_heavily_does_not_deadlock(
        launch: Launch, tmp_path: Path) -> None:
    script = tmp_path / "spammy_parent.py"
    script.write_text(SPAMMY_PARENT, encoding="utf-8")
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", count=2, concurrency=1, queues=["qb"]),
                   script=script, layout={"alpha": 2, "beta": 2})
    swarm.wait_ready(timeout=20)
    # One signal at a time: the kernel merges a signal sent while one is pending.
    swarm.send(signal.SIGTTIN)
    swarm.wait_ready({"alpha": 3, "beta": 3}, timeout=20)
    swarm.send(signal.SIGTTIN)
    grown = swarm.wait_ready({"alpha": 4, "beta": 4}, timeout=20)
    victims = {grown[("alpha", 3)]["pid"], grown[("beta", 0)]["pid"]}
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    swarm.wait_ready({"alpha": 4, "beta": 4}, timeout=20, not_pids=victims)
    size = swarm.log_path.stat().st_size
    assert size > 1_000_000  # the parent really was logging hard all along

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(20) == 0
    swarm.log_path.unlink()  # tens of megabytes of spam


# -- systemd -----------------------------------------------------------------------

@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # A short directory: AF_UNIX paths are limited to about 108 bytes.
    directory = tempfile.mkdtemp(prefix="wurk-notify-")
    path = os.path.join(directory, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield sock, path
    sock.close()
    with contextlib.suppress(OSError):
        os.unlink(path)
        os.rmdir(directory)


def _receive(sock: socket.socket, timeout: float) -> dict[str, str]:
    sock.settimeout(timeout)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)


def test_systemd_hears_ready_after_every_child_and_stopping_on_term(
        launch: Launch, r: redis.Redis, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, env={"NOTIFY_SOCKET": path})
    message = _receive(sock, 15)
    assert message.get("READY") == "1", message
    # By the time systemd hears READY every child is up and registered.
    ready = swarm.ready()
    assert set(ready) == {("alpha", 0), ("alpha", 1), ("beta", 0)}
    assert message["STATUS"] == "alpha: 2/2, beta: 1/1"

    swarm.send(signal.SIGTERM)
    stopping = _receive(sock, 10)
    assert stopping.get("STOPPING") == "1", stopping
    assert swarm.wait_exit() == 0


def _watchdog_pings(sock: socket.socket, seconds: float) -> int:
    pings = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            pings += _receive(sock, left).get("WATCHDOG") == "1"
        except TimeoutError:
            break
    return pings


def test_watchdog_is_fed_only_while_children_beat(
        launch: Launch, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]), layout={"alpha": 1},
                   env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    child = swarm.wait_ready()[("alpha", 0)]["pid"]
    assert _watchdog_pings(sock, 3) >= 2
    os.kill(child, signal.SIGSTOP)  # a wedged child: its heartbeat goes stale
    try:
        _watchdog_pings(sock, 2.5)  # beats age past 3 x 0.5 s in this window
        assert _watchdog_pings(sock, 2) == 0
    finally:
        os.kill(child, signal.SIGCONT)
    assert _watchdog_pings(sock, 3) >= 1
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_notifier_speaks_to_abstract_and_path_sockets(tmp_path: Path) -> None:
    name = f"wurk-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier("@" + name)
        assert notifier.enabled
        assert notifier.notify(READY=1, STATUS="ok")
        assert _receive(sock, 2) == {"READY": "1", "STATUS": "ok"}
        notifier.close()
    quiet = Notifier(None)
    assert not quiet.enabled
    assert quiet.notify(READY=1) is False
    # Nobody listening: reported, not raised.
    nobody = Notifier(str(tmp_path / "nobody.sock"))
    assert nobody.notify(READY=1) is False
    nobody.close()


def test_notifier_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Notifier("@x").watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Notifier("@x").watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier("@x").watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert Notifier("@x").watchdog_interval() is None


# -- probe and process titles --------------------------------------------------------

def probe(swarm: SwarmProcess, pid: int) -> subprocess.CompletedProcess[str]:
    topology = sorted(swarm.log_path.parent.glob("topology-*.toml"))[-1]
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "--topology", str(topology), "--probe",
         "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def test_probe_passes_for_a_beating_swarm_and_fails_for_another_pid(
        launch: Launch) -> None:
    swarm = launch(slot("alpha", count=2, queues=["qa"]), slot("beta", queues=["qb"]),
                   layout={"alpha": 2, "beta": 1})
    swarm.wait_ready()
    good = probe(swarm, swarm.pid)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "alpha: 2" in good.stdout and "beta: 1" in good.stdout
    other = probe(swarm, swarm.pid + 100_000)
    assert other.returncode == 1
    assert "alpha: 0" in other.stdout
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_parent_and_children_show_what_they_are_in_their_titles(launch: Launch) -> None:
    swarm = launch(slot("alpha", concurrency=3, queues=["qa"]), layout={"alpha": 1})
    ready = swarm.wait_ready()
    parent_title = wait_for(lambda: " ".join(psutil.Process(swarm.pid).cmdline()).startswith(
        "wurk-swarm: parent") and " ".join(psutil.Process(swarm.pid).cmdline()),
        what="parent title")
    assert "running" in parent_title and "alpha: 1/1" in parent_title
    child = psutil.Process(ready[("alpha", 0)]["pid"])
    assert wait_for(lambda: "of 3 busy" in " ".join(child.cmdline()), what="child title")
    assert " ".join(child.cmdline()).startswith("wurk-swarm: child alpha#0")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_parent_signals_sent_to_a_child_by_mistake_do_not_kill_it(launch: Launch) -> None:
    swarm = launch(slot("alpha", queues=["qa"]), layout={"alpha": 1})
    pid = swarm.wait_ready()[("alpha", 0)]["pid"]
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTTOU):
        os.kill(pid, signum)
    time.sleep(0.5)
    assert not gone(pid)
    assert swarm.events("child.exited") == []
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


HOSTED_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys, time
    import redis
    os.environ["WURK_TOPOLOGY"] = sys.argv[1]
    import wurk.core.logging
    wurk.core.logging.setup("info", "json")  # the host configures logging, as an app would
    from examples import asgi_app

    async def lifespan():
        messages = asyncio.Queue()
        sent = []
        async def receive():
            return await messages.get()
        async def send(message):
            sent.append(message["type"])
        task = asyncio.ensure_future(asgi_app.app({"type": "lifespan"}, receive, send))
        await messages.put({"type": "lifespan.startup"})
        r = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            infos = [r.hget(i, "info") for i in r.smembers("processes")]
            # Both children: one TERMed before it is ready exits without starting.
            if sum(1 for i in infos if i and json.loads(i).get("swarm_pid") == os.getpid()) >= 2:
                break
            await asyncio.sleep(0.1)
        print(json.dumps({"event": "hosted.ready", "children": len(infos)}), flush=True)
        await messages.put({"type": "lifespan.shutdown"})
        await task
        print(json.dumps({"event": "hosted.done", "sent": sent,
                          "exit_code": asgi_app.runner.swarm.exit_code,
                          "children_left": len(asgi_app.runner.swarm.children)}), flush=True)

    asyncio.run(lifespan())
""")


def test_hosted_swarm_in_an_asgi_app_boots_and_drains_with_the_app(
        launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    script = tmp_path / "hosted.py"
    script.write_text(HOSTED_SCRIPT, encoding="utf-8")
    swarm = launch(slot("alpha", count=2, queues=["qa"]), script=script,
                   layout={"alpha": 2})
    assert swarm.wait_exit(30) == 0
    done = swarm.wait_events("hosted.done")[0]
    assert done["sent"] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert done["exit_code"] == 0 and done["children_left"] == 0
    assert len(swarm.events("child.ready")) == 2
    assert r.smembers("processes") == set()


def test_an_error_in_a_tick_is_logged_and_the_next_tick_runs(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervise thread outlives a bug of its own: a dead one would leave
    every child unwatched (no reaping, no respawn, no drain)."""
    topology = parse({"wurk": {"redis_url": redis_server.url},
                      "slot": [{"name": "a", "count": 1}]}, Path("unit.toml"))
    swarm = Swarm(topology, notifier=Notifier(None))
    calls: list[str] = []

    def flaky() -> None:
        calls.append("tick")
        if len(calls) == 1:
            raise SystemExit("a bug of ours")

    monkeypatch.setattr(swarm, "_read_ready_pipes", flaky)
    monkeypatch.setattr(swarm, "_respawn_missing", lambda: None)
    try:
        with structlog.testing.capture_logs() as logs:
            swarm._tick_safely()
            swarm._tick_safely()
        assert calls == ["tick", "tick"]
        [failed] = [e for e in logs if e["event"] == "swarm.tick_failed"]
        assert failed["error"] == "SystemExit: a bug of ours"
    finally:
        os.close(swarm._wake_r)
        os.close(swarm._wake_w)


def test_a_childs_job_lines_say_its_pid_slot_index_and_thread(launch: Launch,
                                                              r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=1, concurrency=2, queues=["qa"]), layout={"alpha": 1},
                   log_level="info")
    [info] = swarm.wait_ready().values()
    push(r, "qa", "record", "x")
    [done] = swarm.wait_events("job.done")
    assert (done["pid"], done["slot"], done["index"]) == (info["pid"], "alpha", 0)
    assert done["tid"] and done["jid"] and done["queue"] == "qa"
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

"""A hung swarm child is noticed, KILLed and replaced; a Redis outage hangs nobody.

Real ``wurk-swarm`` subprocesses (the launcher of tests/swarms.py), real SIGSTOP,
a real redis-server stopped and started again. The pure parts
(``supervisor.liveness``, ``supervisor.probe`` on hand-written hashes) are
tested in process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import swarms
from conftest import RedisServer, start_redis
from swarms import REPO, Launch, SwarmProcess, gone, push, slot, watchdog_pings
from waiting import wait_for

from supervisor import liveness
from supervisor.probe import probe
from supervisor.swarm import Child
from supervisor.topology import parse
from wurk.redis.runtime import close_runtime

pytestmark = pytest.mark.timeout(90)

launch = swarms.launch
notify_socket = swarms.notify_socket
HEARTBEAT = 0.5  # swarms.BASE_SETTINGS heartbeat_interval
CHILD_TIMEOUT = 5.0
STOPPED_CHILD_TIMEOUT = 10.0


def run_probe(swarm: SwarmProcess) -> subprocess.CompletedProcess[str]:
    topology = sorted(swarm.log_path.parent.glob("topology-*.toml"))[-1]
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "--topology", str(topology), "--probe",
         "--pid", str(swarm.pid)], capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})


def beat_age(r: redis.Redis, identity: str) -> float:
    beat = r.hget(identity, "beat")
    return time.time() - float(beat) if beat is not None else float("inf")


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Pids a test SIGSTOPs; continued afterwards so nothing stays frozen."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)


def test_a_stopped_child_is_killed_replaced_and_its_job_goes_back(
        launch: Launch, r: redis.Redis, stopped: list[int]) -> None:
    # Long enough that a probe started (a Python start-up on a loaded machine)
    # once the beat is stale still runs before the parent replaces the child.
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]), layout={"alpha": 2},
                   child_timeout=STOPPED_CHILD_TIMEOUT)
    swarm.wait_ready()
    push(r, "qa", "slow_incr", "counter", 1.5)
    first = wait_for(lambda: r.lrange("started", 0, -1), what="the job started")[0]
    victim = int(first.split(":")[1])
    identity = swarm.wait_events("child.ready", pid=victim)[0]["identity"]
    os.kill(victim, signal.SIGSTOP)
    stopped.append(victim)
    stopped_at = time.monotonic()

    # Stale (three beats old) but not yet past child_timeout: the probe fails.
    wait_for(lambda: beat_age(r, identity) > 3 * HEARTBEAT + 0.5, what="a stale beat")
    assert not swarm.events("child.hung")
    stale = run_probe(swarm)
    assert stale.returncode == 1, stale.stdout + stale.stderr
    assert "stale children: alpha#" in stale.stdout

    hung = swarm.wait_events("child.hung", timeout=STOPPED_CHILD_TIMEOUT + 10)[0]
    assert hung["pid"] == victim and hung["slot"] == "alpha"
    assert hung["silent"] >= STOPPED_CHILD_TIMEOUT  # rounded
    assert hung["child_timeout"] == STOPPED_CHILD_TIMEOUT
    after = swarm.wait_ready(not_pids={victim}, timeout=25)
    replaced_in = time.monotonic() - stopped_at
    # The child timeout, then a KILL, a respawn and a boot (a second or two
    # idle), with room for a loaded machine.
    assert replaced_in < STOPPED_CHILD_TIMEOUT + 15, replaced_in
    assert gone(victim)
    # Its claimed job went back at once and ran to the end in another child.
    recovered = swarm.wait_events("reaper.recovered", identity=identity)[0]
    assert recovered["requeued"] == 1
    wait_for(lambda: r.get("counter") == "1", what="the job ran again")
    rerun = r.lrange("started", 0, -1)[1]
    assert int(rerun.split(":")[1]) in {info["pid"] for info in after.values()}
    # The KILLed child left processes, so the probe passes once the replacement beats.
    assert identity not in r.smembers("processes")
    assert not r.exists(identity)
    assert not swarm.events("child.killed")  # our own KILL, not the OOM killer's
    wait_for(lambda: run_probe(swarm).returncode == 0, timeout=15, what="the probe passes")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_a_child_killed_by_someone_else_leaves_processes_at_once(
        launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]), layout={"alpha": 2})
    before = swarm.wait_ready()
    victim = before[("alpha", 1)]
    # Registered in Redis is not yet ready for the parent: it must have read the identity.
    swarm.wait_events("child.ready", pid=victim["pid"])
    os.kill(victim["pid"], signal.SIGKILL)
    swarm.wait_events("child.killed", pid=victim["pid"])
    wait_for(lambda: victim["identity"] not in r.smembers("processes"), timeout=5,
             what="the dead child forgotten")
    assert not r.exists(victim["identity"])  # not left to age for a minute
    swarm.wait_ready(not_pids={victim["pid"]})
    wait_for(lambda: run_probe(swarm).returncode == 0, timeout=15, what="the probe passes")
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


class OwnRedis:
    """A swarm's Redis of its own, which a test stops and starts again on its port."""

    def __init__(self) -> None:
        self.server = start_redis()
        self.clients: list[redis.Redis] = []

    def client(self) -> redis.Redis:
        self.clients.append(self.server.client())
        return self.clients[-1]

    def restart(self, swarm: SwarmProcess) -> None:
        self.server = start_redis(port=self.server.port)
        swarm.r = self.client()

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.stop()


@contextlib.contextmanager
def swarm_with_own_redis(launch: Launch, notify_path: str, count: int,
                         **settings: Any) -> Iterator[tuple[SwarmProcess, OwnRedis]]:
    """One slot of ``count`` children on an own Redis, with systemd's watchdog on."""
    own = OwnRedis()
    try:
        swarm = launch(slot("alpha", count=count, concurrency=1, queues=["qa"]),
                       layout={"alpha": count}, redis_url=own.server.url,
                       redis_retry_attempts=2, redis_retry_base=0.1, redis_retry_cap=0.2,
                       env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "1000000"},
                       **settings)
        swarm.r = own.client()
        yield swarm, own
    finally:
        own.close()


def test_a_redis_outage_longer_than_child_timeout_hangs_nobody(
        launch: Launch, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    with swarm_with_own_redis(launch, path, 2, child_timeout=3) as (swarm, own):
        pids = {info["pid"] for info in swarm.wait_ready().values()}
        assert watchdog_pings(sock, 2) >= 1
        own.server.stop()
        swarm.wait_events("heartbeat.error", count=4)
        # Longer than child_timeout without a single beat reaching Redis; the
        # children still pulse, and the watchdog still hears from the parent.
        assert watchdog_pings(sock, 5) >= 2
        own.restart(swarm)
        after = swarm.wait_ready(timeout=20)
        assert {info["pid"] for info in after.values()} == pids
        assert not swarm.events("child.hung")
        assert not swarm.events("child.exited")
        swarm.send(signal.SIGTERM)
        assert swarm.wait_exit(20) == 0


def test_a_child_replaced_during_an_outage_waits_and_the_watchdog_is_still_fed(
        launch: Launch, notify_socket: tuple[socket.socket, str]) -> None:
    """A replacement that waits out a Redis outage pulses the parent, so its
    slot is not short: systemd must not restart the swarm for an outage."""
    sock, path = notify_socket
    with swarm_with_own_redis(launch, path, 1, heartbeat_interval=0.5) as (swarm, own):
        [info] = swarm.wait_ready().values()
        assert watchdog_pings(sock, 2) >= 1
        own.server.stop()
        os.kill(info["pid"], signal.SIGKILL)
        swarm.wait_events("redis.unreachable", count=3)
        # Well past three heartbeat intervals with the slot's only child booting.
        assert watchdog_pings(sock, 4) >= 2
        own.restart(swarm)
        [after] = swarm.wait_ready(timeout=20).values()
        assert after["pid"] != info["pid"]
        swarm.send(signal.SIGTERM)
        assert swarm.wait_exit(20) == 0


# -- in process ------------------------------------------------------------------------

def test_hung_judges_only_ready_children_not_already_stopping() -> None:
    (alpha,) = parse({"slot": [{"name": "a", "child_timeout": 10}]}, Path("t.toml")).slots
    now = 1000.0
    silent = Child(alpha, 0, 101, None, identity="h:101:x", last_pulse=now - 11)
    fresh = Child(alpha, 1, 102, None, identity="h:102:x", last_pulse=now - 9)
    booting = Child(alpha, 2, 103, None, last_pulse=now - 100)
    stopping = Child(alpha, 3, 104, None, identity="h:104:x", last_pulse=now - 100,
                     kill_at=now + 5)
    assert liveness.hung([silent, fresh, booting, stopping], now) == [silent]
    # Fresh means within three heartbeat intervals (5 s each by default).
    assert liveness.all_fresh([fresh, booting], now)
    assert not liveness.all_fresh([fresh, Child(alpha, 4, 105, None, identity="h:105:x",
                                                last_pulse=now - 15.1)], now)


def test_pulses_never_block_and_end_of_file_is_seen() -> None:
    read_end, write_end = os.pipe()
    pulse = liveness.pulser(write_end)
    os.set_blocking(read_end, False)
    for _ in range(100_000):  # far more than a pipe holds: a full pipe is not a hang
        pulse()
    assert liveness.read_pipe(read_end)
    assert liveness.read_pipe(read_end) == b""
    os.close(write_end)
    pulse()  # a closed pipe is ignored too
    assert liveness.read_pipe(read_end) is None
    os.close(read_end)


def test_probe_fails_on_any_stale_child_and_ignores_garbage(
        redis_server: RedisServer, r: redis.Redis) -> None:
    topology = parse({"wurk": {"redis_url": redis_server.url, "heartbeat_interval": 1},
                      "slot": [{"name": "a", "count": 2}]}, Path("t.toml"))
    host, swarm_pid, now = socket.gethostname(), 4242, time.time()

    def child(identity: str, index: int, beat: object) -> None:
        info = {"hostname": host, "swarm_pid": swarm_pid, "slot": "a", "index": index,
                "pid": 5000 + index}
        r.sadd("processes", identity)
        r.hset(identity, mapping={"info": json.dumps(info), "beat": str(beat)})

    child("h:1:a", 0, now)
    assert probe(topology, swarm_pid, host).ok
    r.sadd("processes", "junk1", "junk2", "junk3")
    r.hset("junk1", mapping={"info": "[" * 100_000, "beat": "x"})
    r.hset("junk2", mapping={"info": "not json", "beat": str(now)})
    r.hset("junk3", mapping={"info": "[1, 2]", "beat": str(now)})
    assert probe(topology, swarm_pid, host).ok  # garbage is someone else's, not a crash
    child("h:2:a", 1, now - 100)
    result = probe(topology, swarm_pid, host)
    assert not result.ok and result.fresh == {"a": 1}
    assert len(result.stale) == 1
    assert re.fullmatch(r"a#1 \(pid 5001\) \(beat 10\d\.\d s ago\)", result.stale[0])
    r.hset("h:2:a", "beat", "nan")
    assert not probe(topology, swarm_pid, host).ok
    close_runtime(topology.slots[0].config)

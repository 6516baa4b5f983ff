"""A swarm child that dies, outgrows its memory limit or cannot be spawned is
replaced in its slot, a crash loop backs off, and the supervise loop outlives
an error of its own.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py);
the supervise loop's own error is tested in process.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

import psutil
import pytest
import redis
import structlog.testing
import swarms
from conftest import RedisServer
from swarms import Launch, event_time, gone, push, slot
from waiting import wait_for

from supervisor.swarm import Swarm
from supervisor.systemd import Notifier
from supervisor.topology import parse

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


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
    last_gap = event_time(spawns[-1]) - event_time(exits[-1])
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

"""Signals to ``wurk-swarm``: TTIN and TTOU scale each slot (within its
max_count), HUP and USR1 restart every child one at a time, TSTP quiets every
child, and a parent's signal sent to a child by mistake does not kill it.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py);
scaling away a replacement that is still booting is tested in process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
import swarms
from conftest import RedisServer
from swarms import Launch, gone, push, slot
from waiting import wait_beats, wait_for

from supervisor.swarm import Child, Swarm
from supervisor.systemd import Notifier
from supervisor.topology import parse

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


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
    # A fetch already blocked in Redis may still be waiting out its
    # fetch_timeout (0.5 s): wait until no child has a thread left that could
    # run a job, then give them beats of time to (wrongly) take one.
    children = swarm.ready()
    for info in children.values():
        swarm.wait_processors_gone(info["pid"])
    push(r, "qa", "record", "late-a")
    push(r, "qb", "record", "late-b")
    for info in children.values():
        wait_beats(r, info["identity"])
    assert r.llen("queue:qa") == 1
    assert r.llen("queue:qb") == 1
    assert r.llen("done") == 0
    assert all_quiet()

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0
    assert r.llen("queue:qa") == r.llen("queue:qb") == 1


def test_parent_signals_sent_to_a_child_by_mistake_do_not_kill_it(launch: Launch) -> None:
    swarm = launch(slot("alpha", queues=["qa"]), layout={"alpha": 1})
    pid = swarm.wait_ready()[("alpha", 0)]["pid"]
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTTOU):
        os.kill(pid, signum)
    # Two whole thread dumps (SIGTTIN, sent after them) come after the child
    # has handled every signal above.
    assert "wurk-heartbeat" in swarm.thread_names(pid)
    assert not gone(pid)
    assert swarm.events("child.exited") == []
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

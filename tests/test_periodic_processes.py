"""Where the periodic loop runs: in ``wurk run`` and in the swarm parent, never in a
swarm child. Each test leaves an entry one tick behind (its mark an hour old),
so the process that leads pushes the latest missed tick at once."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import cli_workers
import redis
import swarms
from swarms import Launch, slot
from waiting import wait_for

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
launch = swarms.launch

PERIODIC_MODULE = """
import wurk

wurk.periodic("* * * * *", "cli_echo", args=["tick"], name="every-minute")
"""


def an_hour_behind(r: redis.Redis, name: str) -> None:
    r.hset(f"loops:{name}", "tick", int(time.time()) - 3600)


def test_wurk_run_runs_the_periodic_loop(spawn: Callable[..., cli_workers.Worker],
                                         jobs_dir: Path, r: redis.Redis) -> None:
    (jobs_dir / "cliperiodic.py").write_text(PERIODIC_MODULE)
    an_hour_behind(r, "every-minute")
    worker = spawn("-r", "clijobs", "-r", "cliperiodic", "--log-level", "info")
    wait_for(lambda: r.lrange("cli:done", 0, -1) == ["tick"], timeout=20, what="tick ran")
    fields = r.hgetall("loops:every-minute")
    assert (fields["schedule"], fields["klass"], fields["paused"]) == (
        "* * * * *", "cli_echo", "0")
    assert f":{worker.proc.pid}:" in r.get("wurk:leader:periodic")
    (fired_at, jid), = (json.loads(x) for x in r.lrange("loop-history:every-minute", 0, -1))
    assert int(fields["tick"]) % 60 == 0 and fired_at >= int(fields["tick"]) and len(jid) == 24
    worker.send(signal.SIGTERM)
    assert worker.proc.wait(20) == 0
    assert r.get("wurk:leader:periodic") is None  # given up on the way out


def test_the_swarm_parent_runs_the_topology_entries_and_no_child_competes(
        launch: Launch, r: redis.Redis) -> None:
    an_hour_behind(r, "swarm-tick")
    swarm = launch(slot("a", count=2, concurrency=1),
                   '[[periodic]]\nname = "swarm-tick"\nschedule = "* * * * *"\n'
                   'job = "record"\nargs = ["p"]\n', layout={"a": 2})
    ready = swarm.wait_ready()
    done = wait_for(lambda: r.lrange("done", 0, -1), timeout=20, what="tick ran")
    children = {info["pid"] for info in ready.values()}
    assert len(done) == 1 and int(done[0].split(":")[1]) in children
    holder = r.get("wurk:leader:periodic")
    assert f":{swarm.pid}:" in holder and not any(f":{c}:" in holder for c in children)
    assert r.llen("loop-history:swarm-tick") == 1
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0

"""A swarm slot with ``max_jobs``: its children stop after their jobs and the
parent forks fresh ones in their places; no job is lost or run twice.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py).
"""

from __future__ import annotations

import collections
import signal

import pytest
import redis
import swarms
from swarms import Launch, gone, push, slot
from waiting import wait_for

pytestmark = pytest.mark.timeout(120)

launch = swarms.launch


def test_a_swarm_slot_recycles_its_children_by_count_and_loses_nothing(
        launch: Launch, r: redis.Redis) -> None:
    limit, jobs = 4, 40
    swarm = launch(slot("work", count=2, concurrency=1, queues=["rq"], max_jobs=limit,
                        max_jobs_jitter=0),
                   layout={"work": 2})
    first = {info["pid"] for info in swarm.wait_ready(timeout=30).values()}
    for n in range(jobs):
        push(r, "rq", "record", n)
    wait_for(lambda: r.llen("done") >= jobs, 60, what=f"{jobs} jobs run")
    runs = [entry.rsplit(":", 1) for entry in r.lrange("done", 0, -1)]
    # Every job ran, none twice: a recycle finishes what it took.
    tags = collections.Counter(int(tag) for tag, _ in runs)
    assert sorted(tags) == list(range(jobs)) and set(tags.values()) == {1}
    by_pid = collections.Counter(int(pid) for _, pid in runs)
    # One thread each: a child stops fetching as its 4th job ends, so every
    # child ran 4 but the two alive at the end, which may have split the
    # last jobs between them (3 and 1, say).
    short = [pid for pid, ran in by_pid.items() if ran < limit]
    assert max(by_pid.values()) <= limit and len(short) <= 2, by_pid
    # The children that left did so on their own, after their jobs, with exit 0.
    wait_for(lambda: all(gone(pid) for pid in first), 30, what="first children recycled")
    exits = {e["pid"]: e for e in swarm.events("child.exited")}
    left = [pid for pid in by_pid if pid in exits]
    assert len(left) >= len(by_pid) - 2 and first <= set(left)
    for pid in left:
        assert exits[pid]["exit"] == "status 0", exits[pid]
        assert by_pid[pid] == limit, (pid, by_pid)
    recycled = swarm.events("launcher.recycling", reason="max_jobs")
    assert {e["pid"] for e in recycled} >= set(left)
    assert all(e["jobs"] == limit for e in recycled)
    # Replaced in the slot at once: no crash backoff, both indexes ready again.
    assert not swarm.events("slot.backoff")
    swarm.wait_ready(timeout=30, not_pids=first)
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(30) == 0
    assert r.llen("queue:rq") == 0

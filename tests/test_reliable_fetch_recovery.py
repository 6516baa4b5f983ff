"""A dead process's claimed jobs come back: once its heartbeat lapses, the
reaper returns its private lists to their queues byte for byte and runs them
elsewhere, spares live processes and honours its lock; a death without
evidence (a SIGKILL, a lapsed heartbeat) blames and isolates nobody; a job
that crashes its process (SIGABRT) dies alone.

Real Redis; the killed processes are real ``wurk run`` subprocesses.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from cli_workers import Worker
from conftest import RedisServer
from fetching import (
    Define,
    Launch,
    fake_dead_owner,
    jid_of,
    launch_gated,
    payload,
    private_lists,
    wip,
)
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.redis.runtime import runtime_for
from wurk.runtime.reaper import crashed, recover, sweep
from wurk.settings.config import Config
from wurk.wire import keys

REPO = Path(__file__).resolve().parent.parent


JOBS_MODULE = textwrap.dedent("""
    import os
    import time

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job(name="rf_hang")
    def hang(tag):
        _r.incr("rf:started")
        deadline = time.monotonic() + 30
        while _r.exists("rf:hang") and time.monotonic() < deadline:
            time.sleep(0.05)
        _r.rpush("rf:ran", tag)
        _r.incr("rf:done")


    @wurk.job(name="rf_nap")
    def nap(tag, seconds):
        time.sleep(seconds)
        _r.rpush("rf:ran", tag)


    @wurk.job(name="rf_crash")
    def crash():
        _r.incr("rf:crashes")
        os.abort()
""")


@pytest.fixture
def spawn(redis_server: RedisServer, r: redis.Redis,
          tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    (tmp_path / "rfjobs.py").write_text(JOBS_MODULE)
    workers: list[Worker] = []

    def start(*args: str) -> Worker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
        env.pop("DYNO", None)
        env.update({"REDIS_URL": redis_server.url,
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
                    "WURK_HEARTBEAT_INTERVAL": "0.2", "WURK_FETCH_TIMEOUT": "0.5",
                    "PYTHONUNBUFFERED": "1"})
        worker = Worker(["-r", "rfjobs", "--log-level", "info", *args], env, tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def test_sigkilled_process_jobs_are_recovered_and_run_elsewhere(
        r: redis.Redis, rb: redis.Redis, config: Config,
        spawn: Callable[..., Worker]) -> None:
    raws = [payload("rf_hang", f"job-{i}", queue="rfk") for i in range(2)]
    r.set("rf:hang", 1)
    rb.sadd("queues", "rfk")
    for raw in raws:
        rb.lpush("queue:rfk", raw)
    queued = rb.lrange("queue:rfk", 0, -1)
    worker = spawn("-q", "rfk", "-c", "2")
    wait_for(lambda: int(r.get("rf:started") or 0) == 2 or not worker.alive(), timeout=30)
    assert worker.alive(), worker.stderr()
    (identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    mine = wip(identity, "rfk")
    assert sorted(rb.lrange(mine, 0, -1)) == sorted(raws)
    assert rb.llen("queue:rfk") == 0

    worker.proc.send_signal(signal.SIGKILL)
    assert worker.proc.wait(EVENTUALLY) == -signal.SIGKILL
    # Dead, but its heartbeat has not lapsed yet: nobody may take its jobs.
    r.delete(keys.REAPER_LOCK)  # taken by the child's boot sweep
    assert sweep(runtime_for(config)) == 0
    assert sorted(rb.lrange(mine, 0, -1)) == sorted(raws)
    assert r.get("rf:done") is None

    r.delete(identity)  # what the 60 s TTL would do
    r.delete(keys.REAPER_LOCK)
    assert sweep(runtime_for(config)) == 1
    assert rb.lrange("queue:rfk", 0, -1) == queued  # byte for byte, in the same order
    assert not rb.exists(mine)
    assert identity not in r.smembers(keys.WIP_OWNERS)
    assert not r.exists(keys.wip_queues(identity))
    # A lapsed heartbeat is no evidence against the jobs: neither is blamed,
    # neither is a suspect, so both may run again at once, side by side.
    for raw in raws:
        assert r.get(keys.pill(jid_of(raw))) is None
    assert not rb.exists(keys.SUSPECTS)

    r.delete("rf:hang")
    second = spawn("-q", "rfk", "-c", "2")
    wait_for(lambda: int(r.get("rf:done") or 0) == 2 or not second.alive(), timeout=10)
    assert second.alive(), second.stderr()
    assert sorted(r.lrange("rf:ran", 0, -1)) == ["job-0", "job-1"]
    assert int(r.get("rf:started") or 0) == 4
    (second_identity,) = [str(m) for m in r.smembers(keys.WIP_OWNERS)]
    assert second_identity != identity
    wait_for(lambda: not rb.exists(wip(second_identity, "rfk")))  # both acked
    assert rb.llen("queue:rfk") == 0
    assert not rb.exists(keys.SUSPECTS)  # each finished a run: cleared
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(EVENTUALLY) == 0, second.stderr()
    assert r.smembers(keys.WIP_OWNERS) == set()


@pytest.mark.timeout(180)  # up to eight worker start-ups, each seconds on a loaded machine
def test_a_job_that_kills_its_process_dies_alone_and_its_neighbours_complete(
        r: redis.Redis, rb: redis.Redis, config: Config,
        spawn: Callable[..., Worker]) -> None:
    """One crasher among 20 jobs, 4 threads: the jobs that were running
    beside it when it took the process down must not share its blame."""
    config = tuned(config, max_recoveries=2)
    innocents = [payload("rf_nap", f"innocent-{n}", 0.2, queue="rfx") for n in range(20)]
    crasher = payload("rf_crash", queue="rfx")
    rb.sadd("queues", "rfx")
    for raw in [*innocents[:2], crasher, *innocents[2:]]:  # the third one fetched
        rb.lpush("queue:rfx", raw)
    def dies_or_drains(worker: Worker) -> bool:
        return not worker.alive() or not (rb.llen("queue:rfx") or private_lists(rb, "*"))

    deaths = 0
    while deaths < 8:
        worker = spawn("-q", "rfx", "-c", "4")
        wait_for(functools.partial(dies_or_drains, worker), timeout=20,
                 what=f"worker {deaths + 1} dies or drains")
        if worker.alive():
            break
        assert worker.proc.wait(EVENTUALLY) == -signal.SIGABRT, worker.stderr()
        deaths += 1
        (identity,) = r.smembers(keys.WIP_OWNERS)
        # What the swarm parent does when it reaps a child killed by SIGABRT.
        recover(runtime_for(config), str(identity), cause=crashed("killed by SIGABRT"))
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(10) == 0, worker.stderr()

    completed = set(r.lrange("rf:ran", 0, -1))
    dead = rb.zrange("dead", 0, -1)
    innocents_dead = sum(raw in dead for raw in innocents)
    print(f"\n{deaths} crashes; innocents completed {len(completed)}/20, "
          f"innocents dead {innocents_dead}, crasher dead {crasher in dead}")
    assert innocents_dead == 0
    assert completed == {f"innocent-{n}" for n in range(20)}
    assert [jid_of(raw) for raw in dead] == [jid_of(crasher)]
    entry = json.loads(dead[0])
    assert entry["error_class"] == "ProcessCrashed"
    assert "killed by SIGABRT" in entry["error_message"]
    assert f"{config.max_recoveries + 1} times" in entry["error_message"]
    # Blamed only for the crashes it caused alone: max_recoveries + 1 of them
    # (its first, beside other jobs, made it a suspect).
    assert int(r.get("rf:crashes") or 0) == deaths == config.max_recoveries + 2
    assert rb.llen("queue:rfx") == 0
    assert not rb.exists(keys.SUSPECTS)


def between_sweeps() -> bool:
    """No reaper thread of this process is inside ``sweep()`` (read from the
    threads' own stacks, not guessed from time passed)."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread.name != "wurk-reaper":
            continue
        frame = frames.get(thread.ident or -1)
        while frame is not None:
            if frame.f_code is sweep.__code__:
                return False
            frame = frame.f_back
    return True


def test_reaper_spares_live_processes_and_respects_its_lock(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config = tuned(config, concurrency=1)
    gate, job, live_raw, launcher = launch_gated(rb, define, launch, "live")
    try:
        assert gate.started.wait(EVENTUALLY)
        # The launcher's boot sweep took the lock (its first step) and is over:
        # it read the owners before the dead one below exists.
        wait_for(lambda: r.exists(keys.REAPER_LOCK) and between_sweeps(),
                 what="the boot sweep over")
        assert r.exists(launcher.identity)  # its heartbeat hash
        dead_a = payload(job.name, "dead-a", queue="rfdead")
        fake_dead_owner(rb, "ghost:1:aaaaaaaaaaaa", "rfdead", dead_a)

        # Lock held: this sweep does nothing at all.
        assert sweep(runtime_for(config)) == 0
        assert rb.lrange(wip("ghost:1:aaaaaaaaaaaa", "rfdead"), 0, -1) == [dead_a]
        ttl = r.ttl(keys.REAPER_LOCK)
        assert 0 < ttl <= max(1, int(config.reaper_interval / 2))

        r.delete(keys.REAPER_LOCK)
        assert sweep(runtime_for(config)) == 1
        assert rb.lrange("queue:rfdead", 0, -1) == [dead_a]
        assert "ghost:1:aaaaaaaaaaaa" not in r.smembers(keys.WIP_OWNERS)
        # The live process keeps its running job and its ownership.
        assert rb.lrange(wip(launcher.identity, "default"), 0, -1) == [live_raw]
        assert launcher.identity in r.smembers(keys.WIP_OWNERS)
        assert r.get(keys.pill(jid_of(live_raw))) is None
        assert 0 < r.ttl(keys.REAPER_LOCK) <= max(1, int(config.reaper_interval / 2))

        # A second sweep inside the lock's lifetime: another dead owner waits.
        dead_b = payload(job.name, "dead-b", queue="rfdead")
        fake_dead_owner(rb, "ghost:2:bbbbbbbbbbbb", "rfdead", dead_b)
        assert sweep(runtime_for(config)) == 0
        assert rb.lrange(wip("ghost:2:bbbbbbbbbbbb", "rfdead"), 0, -1) == [dead_b]
        assert "ghost:2:bbbbbbbbbbbb" in r.smembers(keys.WIP_OWNERS)
    finally:
        gate.release.set()
    wait_for(lambda: not rb.exists(wip(launcher.identity, "default")))
    assert gate.runs == ["live"]

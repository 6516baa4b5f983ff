"""Reliable fetch claims and acknowledges: a running job sits in the process's
private list (``wurk:wip:<identity>:<queue>``) until its ack; claims are
batched and bounded by the threads; paused queues are never claimed; an idle
fetcher blocks in Redis and takes a new job at once; every move works at
maxmemory; and basic fetch still works without private lists.

Real Redis, real launchers and threads.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import pytest
import redis
from conftest import RedisServer, fill_to_maxmemory
from fetching import (
    Define,
    Gate,
    Launch,
    blocked_in_brpoplpush,
    jid_of,
    payload,
    private_lists,
    wip,
)
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.runtime.reaper import recover
from wurk.settings.config import Config
from wurk.wire import keys


def test_running_job_sits_in_private_list_and_ack_clears_it_and_its_pill(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    gate = Gate()
    job = define(gate.run)
    raw = payload(job.name, "one")
    pill = keys.pill(jid_of(raw))
    rb.set(pill, 2)
    rb.expire(pill, 3600)
    rb.sadd("queues", "default")
    rb.lpush("queue:default", raw)
    launcher = launch()
    try:
        assert gate.started.wait(EVENTUALLY)
        mine = wip(launcher.identity, "default")
        assert rb.lrange(mine, 0, -1) == [raw]
        assert rb.llen("queue:default") == 0
        assert launcher.identity in r.smembers(keys.WIP_OWNERS)
        assert "default" in r.smembers(keys.wip_queues(launcher.identity))
        assert rb.get(pill) == b"2"
    finally:
        gate.release.set()
    wait_for(lambda: rb.llen(mine) == 0 and not rb.exists(pill))
    assert not rb.exists(mine)
    assert rb.llen("queue:default") == 0
    assert gate.runs == ["one"]
    launcher.stop()
    assert private_lists(rb, launcher.identity) == []
    assert launcher.identity not in r.smembers(keys.WIP_OWNERS)
    assert int(r.get("stat:processed") or 0) == 1


def test_claims_are_batched_and_every_job_runs_exactly_once(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    jobs = 200
    # keep the scheduler's scripts out of the count
    config = tuned(config, concurrency=10, queues=["rfb"], poll_interval_average=30.0)
    ran = redis.Redis(host="127.0.0.1", port=rb.connection_pool.connection_kwargs["port"])

    def record(n: int) -> None:
        ran.rpush("rf:ran", n)

    job = define(record)
    pipe = rb.pipeline(transaction=False)
    for n in range(jobs):
        pipe.lpush("queue:rfb", payload(job.name, n, queue="rfb"))
    pipe.execute()
    r.config_resetstat()
    t0 = time.monotonic()
    launcher = launch()
    try:
        wait_for(lambda: r.llen("rf:ran") >= jobs, timeout=15)
        elapsed = time.monotonic() - t0
        calls = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        wait_for(lambda: not rb.exists(wip(launcher.identity, "rfb")))  # every ack landed
    finally:
        launcher.stop()
        ran.close()
    done = [int(x) for x in r.lrange("rf:ran", 0, -1)]
    assert len(done) == jobs
    assert sorted(done) == list(range(jobs))  # no job twice, none lost
    assert r.llen("queue:rfb") == 0
    print(f"\n{jobs} jobs, {calls} EVALSHA round trips ({jobs / max(calls, 1):.2f} jobs each), "
          f"{elapsed:.2f}s")
    assert 0 < calls < jobs


def test_a_busy_process_holds_no_more_jobs_than_it_has_threads(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    """A claimed job that no thread runs is in no queue and no work hash:
    Sidekiq's API cannot see it and idle threads elsewhere cannot take it."""
    config = tuned(config, concurrency=4, queues=["rfidle"])
    jobs = 80
    job = define(lambda n: time.sleep(0.01 * (n % 3)))
    pipe = rb.pipeline(transaction=False)
    for n in range(jobs):
        pipe.lpush("queue:rfidle", payload(job.name, n, queue="rfidle"))
    pipe.execute()
    launcher = launch()
    mine = wip(launcher.identity, "rfidle")
    held: collections.Counter[int] = collections.Counter()
    deadline = time.monotonic() + 20
    while (rb.llen("queue:rfidle") or rb.exists(mine)) and time.monotonic() < deadline:
        held[rb.llen(mine)] += 1
    assert rb.llen("queue:rfidle") == 0 and not rb.exists(mine), "did not drain in 20 s"
    print(f"\nprivate-list length: samples per length {sorted(held.items())}")
    assert max(held) <= config.concurrency, sorted(held.items())
    assert held[config.concurrency] > 0  # the sampling saw a full process


def test_paused_queue_is_never_claimed_until_unpaused(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config = tuned(config, queues=["rfheld", "rffree"])
    ran: list[str] = []
    job = define(ran.append)
    r.sadd("paused", "rfheld")
    held = payload(job.name, "held", queue="rfheld")
    rb.lpush("queue:rfheld", held)
    for i in range(3):
        rb.lpush("queue:rffree", payload(job.name, f"free-{i}", queue="rffree"))
    launcher = launch()
    wait_for(lambda: len(ran) == 3)
    time.sleep(0.6)  # several claim and block rounds
    assert sorted(ran) == ["free-0", "free-1", "free-2"]  # and not "held"
    assert rb.lrange("queue:rfheld", 0, -1) == [held]
    assert not rb.exists(wip(launcher.identity, "rfheld"))
    r.srem("paused", "rfheld")
    wait_for(lambda: "held" in ran)
    assert rb.llen("queue:rfheld") == 0
    wait_for(lambda: not rb.exists(wip(launcher.identity, "rfheld")))


@pytest.mark.parametrize(("queues", "target", "bound"), [
    (["rfsolo"], "rfsolo", 3.0),
    (["rffirst", "rfsecond"], "rfsecond", 4.0),
])
def test_idle_fetcher_picks_up_a_new_job_quickly(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        queues: list[str], target: str, bound: float) -> None:
    # A long fetch timeout (10 s): only a blocking wait (or, with several
    # queues, a short poll of 0.25 s) can make the latency bound, which leaves
    # a loaded machine seconds of room.
    config = tuned(config, fetch_timeout=10.0, queues=queues, concurrency=2)
    started: list[float] = []

    def stamp() -> None:
        started.append(time.time())

    job = define(stamp)
    launch()
    wait_for(lambda: blocked_in_brpoplpush(r))
    time.sleep(0.1)
    pushed = time.time()
    rb.lpush(f"queue:{target}", payload(job.name, queue=target))
    wait_for(lambda: started, timeout=15)
    latency = started[0] - pushed
    assert latency < bound, f"job started {latency:.3f}s after the push"


def test_claim_ack_requeue_and_recover_move_jobs_at_maxmemory(
        own_redis: RedisServer, define: Define,
        launch_with: Callable[..., Launcher]) -> None:
    """Moves that do not grow memory must work when Redis refuses writes."""
    client = redis.Redis(host="127.0.0.1", port=own_redis.port)
    ran: list[int] = []
    gate = threading.Event()

    def work(n: int) -> None:
        ran.append(n)
        if n < 0:
            gate.wait(10)  # still running at stop: given back
    job = define(work)
    quick = [payload(job.name, n) for n in range(20)]
    held = payload(job.name, -1)
    client.lpush("queue:default", *quick, held)
    # A dead process's private list, for the recovery below.
    client.sadd(keys.WIP_OWNERS, "gone:1:000000000000")
    client.sadd(keys.wip_queues("gone:1:000000000000"), "other")
    client.lpush(wip("gone:1:000000000000", "other"), payload(job.name, 99, queue="other"))
    fill_to_maxmemory(client)
    config = Config(redis_url=own_redis.url, concurrency=2, fetch_timeout=0.2,
                    heartbeat_interval=0.2, shutdown_timeout=0.5, log_level="warning")
    try:
        launcher = launch_with(config)  # before: the first heartbeat raised OOM here
        wait_for(lambda: len(ran) == 21, what="every job claimed and started")
        wait_for(lambda: client.llen(wip(launcher.identity, "default")) == 1,
                 what="every finished job acknowledged")
        assert client.llen("queue:default") == 0
        launcher.stop(time.monotonic() + 0.5)
        assert client.lrange("queue:default", 0, -1) == [held]  # requeued at stop
        assert private_lists(client, launcher.identity) == []
        assert recover(runtime_for(config), "gone:1:000000000000") == (1, 0)
        assert client.llen("queue:other") == 1
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("still", "full")
    finally:
        gate.set()
        close_runtime(config)
        client.close()


def test_basic_fetch_still_works_without_private_lists(
        r: redis.Redis, config: Config, define: Define, launch: Launch) -> None:
    config = tuned(config, reliable_fetch=False)
    done = threading.Event()
    job = define(done.set)
    job.perform_async()
    launcher = launch()
    assert done.wait(EVENTUALLY)
    assert type(launcher.manager.fetch).__name__ == "BasicFetch"
    # The push left its connection's mark (wurk.push.landing), nothing else.
    assert [k for k in r.keys("wurk:*") if not k.startswith(keys.PUSH_MARK_PREFIX)] == []
    launcher.stop()
    assert [k for k in r.keys("wurk:*") if not k.startswith(keys.PUSH_MARK_PREFIX)] == []
    assert int(r.get("stat:processed") or 0) == 1

"""The asyncio executor in one process (issue #17): real Launchers, the suite's redis-server.

Hundreds of coroutines at once under one loop, sync jobs beside them on the
pool, middleware of both kinds, retries, soft limits, and a stop that hands
running coroutines back. Processes (``wurk run``, a swarm, SIGKILL) are in
test_aio_executor_procs.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from faultproxy import FaultProxy
from fetching import private_lists
from waiting import wait_for

import wurk
from wurk.push.job import JobFunction
from wurk.runtime import event_loop
from wurk.runtime.aio_manager import AsyncManager
from wurk.runtime.aio_processor import sync_threads
from wurk.runtime.launcher import Launcher
from wurk.runtime.manager import Manager
from wurk.runtime.middleware import current_job
from wurk.settings.config import Config, ConfigError

pytestmark = pytest.mark.timeout(60)
Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


@pytest.fixture
def aio_config(config: Config) -> Iterator[Config]:
    cfg = dataclasses.replace(config, executor="asyncio", concurrency=50)
    wurk.configure(cfg)
    yield cfg
    wurk.configure(config)


def asyncio_config(config: Config, **changes: Any) -> Config:
    cfg = dataclasses.replace(config, **changes)
    wurk.configure(cfg)
    return cfg


class Tally:
    """Jobs running now and the most at once, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.done = 0
        self.threads: set[str] = set()
        self.jids: dict[str, str | None] = {}

    def enter(self, tag: str) -> None:
        job = current_job()
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.threads.add(threading.current_thread().name)
            self.jids[tag] = job.get("jid") if job else None

    def leave(self) -> None:
        with self.lock:
            self.now -= 1
            self.done += 1


def test_the_executor_setting_picks_the_manager(config: Config, aio_config: Config) -> None:
    assert type(Launcher(config).manager) is Manager
    launcher = Launcher(aio_config)
    assert isinstance(launcher.manager, AsyncManager)
    assert sync_threads(aio_config) == 16
    assert sync_threads(dataclasses.replace(aio_config, executor_threads=3)) == 3
    with pytest.raises(ConfigError, match="executor must be one of threads, asyncio"):
        Config.from_mapping({"executor": "gevent"}, source="test")
    with pytest.raises(ConfigError, match="executor_threads"):
        Config.from_mapping({"executor_threads": 0}, source="test")


def test_five_hundred_coroutines_run_at_once_and_never_more(
        config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    cfg = asyncio_config(config, executor="asyncio", concurrency=500)
    tally = Tally()
    gate = asyncio.Event()

    async def crowd(tag: str) -> None:
        tally.enter(tag)
        try:
            # None ends before the test saw 500 running at once (no polling: one event).
            await asyncio.wait_for(gate.wait(), 30)
            await asyncio.sleep(0.01)
        finally:
            tally.leave()

    job = define(crowd)
    for i in range(800):
        job.perform_async(f"c{i}")
    launcher = launch_with(cfg)
    wait_for(lambda: tally.now == 500, timeout=30)
    # The heartbeat reports them in flight, one work-hash field each.
    wait_for(lambda: r.hlen(f"{launcher.identity}:work") == 500, timeout=10)
    event_loop.loop().call_soon_threadsafe(gate.set)
    wait_for(lambda: tally.done == 800, timeout=40)
    assert tally.peak == 500
    assert tally.threads == {"wurk-asyncio"}
    assert all(tally.jids.values()) and len(set(tally.jids.values())) == 800
    wait_for(lambda: int(r.get("stat:processed") or 0) == 800)


def test_sync_and_async_jobs_mix_each_where_it_belongs(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    tally = Tally()

    async def flying(tag: str) -> str:
        tally.enter(tag)
        await asyncio.sleep(0.01)
        tally.leave()
        return tag

    def walking(tag: str) -> None:
        tally.enter(tag)
        time.sleep(0.01)
        tally.leave()

    fly, walk = define(flying), define(walking)
    for i in range(100):
        fly.perform_async(f"a{i}")
    for i in range(20):
        walk.perform_async(f"s{i}")
    launch_with(aio_config)
    wait_for(lambda: tally.done == 120, timeout=30)
    assert "wurk-asyncio" in tally.threads
    sync_threads_used = tally.threads - {"wurk-asyncio"}
    assert sync_threads_used and all(t.startswith("wurk-sync-") for t in sync_threads_used)
    assert len(sync_threads_used) <= sync_threads(aio_config)
    assert len({v for v in tally.jids.values() if v}) == 120  # each saw its own job
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0


def test_server_middleware_sync_or_async_wraps_async_jobs(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    seen: list[tuple[str, str, str | None]] = []

    async def timing(payload: Any, queue: str, call_next: Any) -> Any:
        seen.append(("async", threading.current_thread().name, (current_job() or {}).get("jid")))
        return await call_next()

    def counting(payload: Any, queue: str, call_next: Any) -> Any:
        seen.append(("sync", threading.current_thread().name, (current_job() or {}).get("jid")))
        return call_next()

    async def job(tag: str) -> None:
        r.rpush("mw:done", tag)

    registered = define(job)
    native = dataclasses.replace(aio_config, server_middleware=[timing])
    launcher = launch_with(native)
    jid = registered.perform_async("native")
    wait_for(lambda: r.llen("mw:done") == 1)
    launcher.stop(time.monotonic() + 1)
    assert seen == [("async", "wurk-asyncio", jid)]  # awaited in the job's own task

    seen.clear()
    mixed = dataclasses.replace(aio_config, server_middleware=[counting, timing])
    launch_with(mixed)
    jid = registered.perform_async("mixed")
    wait_for(lambda: r.llen("mw:done") == 2)
    # A sync middleware runs on a pool thread; the async one still on the loop.
    assert [(kind, name.rsplit("-", 1)[0], j) for kind, name, j in seen] == [
        ("sync", "wurk-sync", jid), ("async", "wurk", jid)]
    assert seen[1][1] == "wurk-asyncio"


def test_an_async_job_that_raises_retries_as_usual(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    async def broken(tag: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"broken {tag}")

    jid = define(broken).perform_async("x")
    launch_with(aio_config)
    wait_for(lambda: r.zcard("retry") == 1)
    [raw] = r.zrange("retry", 0, -1)
    failed = json.loads(raw)
    assert (failed["jid"], failed["error_class"], failed["retry_count"]) == (
        jid, "ValueError", 0)
    assert failed["error_message"] == "broken x"
    wait_for(lambda: int(r.get("stat:failed") or 0) == 1)
    assert r.llen("queue:default") == 0


def test_a_soft_limit_cancels_the_task_and_retries_it(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    async def dawdle() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            r.rpush("soft:cancelled", "1")
            raise

    async def quick() -> None:
        r.rpush("soft:quick", "1")

    jid = define(dawdle, timeout=0.3).perform_async()
    launch_with(aio_config)
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    failed = json.loads(r.zrange("retry", 0, -1)[0])
    assert (failed["jid"], failed["error_class"]) == (jid, "JobTimeout")
    assert r.lrange("soft:cancelled", 0, -1) == ["1"]
    define(quick).perform_async()  # the loop runs on
    wait_for(lambda: r.llen("soft:quick") == 1)


def test_a_coroutine_that_swallows_its_soft_limit_still_fails_with_it(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "ignored"
        return "slept"

    define(stubborn, timeout=0.2).perform_async()
    launch_with(aio_config)
    wait_for(lambda: r.zcard("retry") == 1, timeout=10)
    assert json.loads(r.zrange("retry", 0, -1)[0])["error_class"] == "JobTimeout"


def test_a_stop_hands_running_coroutines_back_and_cancels_them(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    async def long(tag: str) -> None:
        r.rpush("stop:started", tag)
        try:
            await asyncio.sleep(30)
        finally:
            r.rpush("stop:unwound", tag)

    async def short(tag: str) -> None:
        await asyncio.sleep(0.05)
        r.rpush("stop:done", tag)

    longs = {define(long).perform_async(f"l{i}") for i in range(30)}
    quick = define(short)
    for i in range(10):
        quick.perform_async(f"s{i}")
    launcher = launch_with(aio_config)
    wait_for(lambda: r.llen("stop:started") == 30 and r.llen("stop:done") == 10, timeout=20)
    assert launcher.stop(time.monotonic() + 0.3) == 30
    back = {json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)}
    assert back == longs
    assert r.llen("stop:unwound") == 30  # cancelled, not left pending
    assert launcher.manager.in_flight.busy() == 0
    assert r.zcard("retry") == 0 and r.zcard("dead") == 0  # handed back, not failed
    assert not [k for k in r.keys("wurk:wip:*") if r.type(k) == "list" and r.llen(k)]


def test_basic_fetch_feeds_the_loop_too(
        config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    cfg = asyncio_config(config, executor="asyncio", concurrency=100, reliable_fetch=False)

    async def tick(i: int) -> None:
        await asyncio.sleep(0.01)
        r.sadd("basic:done", i)

    job = define(tick)
    for i in range(300):
        job.perform_async(i)
    launch_with(cfg)
    wait_for(lambda: r.scard("basic:done") == 300, timeout=30)


def test_garbage_and_unknown_classes_settle_as_in_the_threads_executor(
        aio_config: Config, launch_with: Launch, r: redis.Redis) -> None:
    r.lpush("queue:default", b"{not json")
    r.lpush("queue:default", json.dumps({"class": "NoSuchJob", "args": [], "jid": "j1",
                                         "retry": True, "queue": "default"}))
    r.sadd("queues", "default")
    launch_with(aio_config)
    wait_for(lambda: r.zcard("dead") == 1 and r.zcard("retry") == 1, timeout=10)
    assert r.zrange("dead", 0, -1) == ["{not json"]
    assert json.loads(r.zrange("retry", 0, -1)[0])["error_class"] == "UnknownJobError"


def test_a_coroutine_stuck_in_sync_code_is_settled_at_its_hard_limit(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    release = threading.Event()

    async def wedged() -> None:
        r.rpush("hard:started", "1")
        release.wait(20)  # sync code: the loop itself is held, no await to cancel at

    jid = define(wedged, hard_timeout=0.5).perform_async()
    launcher = launch_with(aio_config, on_stop_request=lambda: None)
    try:
        # Settled as a JobTimeout by the watch thread while the loop is still held.
        wait_for(lambda: r.zcard("retry") == 1, timeout=15)
        failed = json.loads(r.zrange("retry", 0, -1)[0])
        assert (failed["jid"], failed["error_class"]) == (jid, "JobTimeout")
        wait_for(launcher.overran.is_set)  # and the process asked to recycle
        assert not release.is_set()
    finally:
        release.set()
    wait_for(lambda: launcher.manager.in_flight.busy() == 0)
    assert r.zcard("retry") == 1 and r.llen("queue:default") == 0  # settled once


def test_a_stop_gives_back_sync_jobs_waiting_for_a_pool_thread(
        config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    # Basic fetch: nothing but the stop itself can give these jobs back.
    cfg = asyncio_config(config, executor="asyncio", concurrency=20, executor_threads=2,
                         reliable_fetch=False)
    release = threading.Event()

    def blocked(tag: str) -> None:
        r.rpush("pool:started", tag)
        release.wait(20)

    job = define(blocked)
    jids = {job.perform_async(f"b{i}") for i in range(12)}
    launcher = launch_with(cfg)
    try:
        # Two run, ten wait for a thread while holding their places.
        wait_for(lambda: r.llen("pool:started") == 2 and launcher.manager.running() == 12)
        # At least 12: a feeder's fetch still open may take one given back, and give it again.
        assert launcher.stop(time.monotonic() + 0.3) >= 12
    finally:
        release.set()
    back = {json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)}
    assert back == jids
    assert r.llen("pool:started") == 2  # the ten never started


def test_nothing_a_coroutine_raises_or_does_to_the_loop_stops_the_executor(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis) -> None:
    async def leave() -> None:
        raise SystemExit(3)

    async def interrupt() -> None:
        raise KeyboardInterrupt

    async def stopper() -> None:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.5)  # the loop stops under it: cancelled, retried

    async def after(tag: str) -> None:
        await asyncio.sleep(0)
        r.rpush("loop:after", tag)

    for fn in (leave, interrupt, stopper):
        define(fn, retry=1).perform_async()
    launch_with(aio_config)
    wait_for(lambda: r.zcard("retry") == 3, timeout=15)
    classes = sorted(json.loads(raw)["error_class"] for raw in r.zrange("retry", 0, -1))
    assert classes == ["CancelledError", "KeyboardInterrupt", "SystemExit"]
    job = define(after)
    for i in range(20):
        job.perform_async(f"t{i}")
    wait_for(lambda: r.llen("loop:after") == 20, timeout=15)


def test_a_redis_outage_loses_no_running_coroutine(
        config: Config, launch_with: Launch, define: Define, r: redis.Redis,
        proxy: FaultProxy) -> None:
    # The worker talks to Redis through the proxy; the jobs record on the test's own line.
    cfg = asyncio_config(config, executor="asyncio", concurrency=100, redis_url=proxy.url)

    async def steady(tag: str) -> None:
        await asyncio.sleep(0.3)
        r.sadd("out:done", tag)

    job = define(steady)
    tags = {f"o{i}" for i in range(200)}
    for tag in sorted(tags):
        job.perform_async(tag)
    launcher = launch_with(cfg)
    wait_for(lambda: r.scard("out:done") >= 30, timeout=20)
    proxy.refuse()
    proxy.half_close()  # every open connection ends; no new one until heal
    time.sleep(1.5)  # the running coroutines end meanwhile; their acks must wait
    proxy.heal()
    wait_for(lambda: r.smembers("out:done") == tags, timeout=40)
    wait_for(lambda: launcher.manager.in_flight.busy() == 0 and r.llen("queue:default") == 0,
             timeout=20)
    # Every one acknowledged once Redis was back: the private list is empty.
    wait_for(lambda: not [k for k in r.keys("wurk:wip:*") if r.type(k) == "list" and r.llen(k)],
             timeout=20)
    assert r.zcard("dead") == 0


def test_plain_successes_settle_on_the_loop_and_the_rest_on_bookkeeping(
        config: Config, launch_with: Launch, define: Define, rb: redis.Redis) -> None:
    cfg = asyncio_config(config, executor="asyncio", concurrency=100, reliable_fetch=True)

    async def plain(n: int) -> int:
        await asyncio.sleep(0.001)
        return n

    async def kept(n: int) -> int:
        await asyncio.sleep(0.001)
        return n * n

    async def single(n: int) -> None:
        await asyncio.sleep(0.001)

    plain_job = define(plain)
    kept_job = define(kept, store_result=True, result_ttl=60)
    unique_job = define(single, unique_for=60)
    for n in range(200):
        plain_job.perform_async(n)
    kept_jids = [kept_job.perform_async(n) for n in range(20)]
    unique_job.perform_async(1)
    launcher = launch_with(cfg)
    wait_for(lambda: int(rb.get("stat:processed") or 0) == 221, timeout=30)
    # Every run was acknowledged (nothing left in our private lists), each
    # result written, and the unique lock released on success.
    wait_for(lambda: not any(rb.llen(key) for key in private_lists(rb, launcher.identity)),
             what="every ack flushed")
    assert [wurk.result(jid, timeout=10) for jid in kept_jids] == [n * n for n in range(20)]
    assert unique_job.perform_async(1) is not None
    assert int(rb.get("stat:failed") or 0) == 0


def test_a_stop_waits_for_an_ack_in_flight_so_a_done_job_is_not_pushed_back(
        aio_config: Config, launch_with: Launch, define: Define, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from wurk.runtime import private_lists as lists

    real = lists.settle
    sending = threading.Event()

    def slow_settle(*args: Any, **kwargs: Any) -> None:
        # The bookkeeping pool's ack, caught in flight as the stop begins.
        sending.set()
        time.sleep(0.5)
        real(*args, **kwargs)

    monkeypatch.setattr(lists, "settle", slow_settle)

    def fetcher_blocks() -> bool:
        # Blocked now ("b"), not a connection whose last command was one.
        return any(c.get("cmd") == "brpoplpush" and "b" in c.get("flags", "")
                   for c in r.client_list())

    async def job() -> None:
        # Ends once the fetcher blocks on the empty queue: the ack is then sent
        # at once, by the bookkeeping pool, not with the next claim.
        while not fetcher_blocks():
            await asyncio.sleep(0.01)
        r.rpush("ack:done", "1")

    registered = define(job)
    # A long block, so the fetcher is still in it when the job ends (a stop
    # ends it at once).
    launcher = launch_with(dataclasses.replace(aio_config, fetch_timeout=30))
    registered.perform_async()
    wait_for(lambda: r.llen("ack:done") == 1)
    assert sending.wait(10)
    launcher.stop(time.monotonic() + 5)
    # The release found the job acknowledged: nothing went back to run again.
    assert r.llen("queue:default") == 0
    assert not any(r.llen(k) for k in r.keys("wurk:wip:*"))

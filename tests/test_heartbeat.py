"""The heartbeat as Sidekiq's API and Web UI read it (spec §8, §9, §10)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer, fill_to_maxmemory
from structlog.testing import capture_logs
from tuning import tuned
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.push.job import JobFunction, registry
from wurk.redis.runtime import close_runtime
from wurk.runtime.heartbeat import Heartbeat, make_identity
from wurk.runtime.inflight import Counters, InFlightTable
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.settings.queues import parse_queues
from wurk.version import __version__

Launch = Callable[..., Launcher]
IDENTITY = re.compile(r"^(?P<host>.+):(?P<pid>\d+):(?P<nonce>[0-9a-f]{12})$")


@pytest.fixture
def blocking_job() -> Iterator[tuple[JobFunction[..., Any], threading.Event, threading.Event]]:
    """A job that signals it started and then waits (at most 3 s) to be released."""
    started = threading.Event()
    release = threading.Event()
    name = f"hb_block_{uuid.uuid4().hex}"

    @wurk.job(name=name)
    def block(*_args: Any) -> None:
        started.set()
        release.wait(3)

    yield block, started, release
    release.set()
    registry.discard(name)


def signal_process(r: redis.Redis, identity: str, name: str) -> None:
    """What Sidekiq's API does for Process#quiet! / #stop! / #dump_threads."""
    with r.pipeline(transaction=True) as pipe:
        pipe.lpush(f"{identity}-signals", name)
        pipe.expire(f"{identity}-signals", 60)
        pipe.execute()


def test_make_identity_shape() -> None:
    identity = make_identity()
    match = IDENTITY.match(identity)
    assert match is not None
    assert int(match["pid"]) == os.getpid()
    assert make_identity() != identity
    assert make_identity("web.1", 42).startswith("web.1:42:")


def test_identity_registered_with_a_full_hash(r: redis.Redis, config: Config,
                                              launch: Launch) -> None:
    config = tuned(config, tag="mytag", labels=["blue"], queues=["critical:3", "default"],
                   concurrency=4)
    before = time.time()
    launcher = launch()
    identity = launcher.identity
    assert r.smembers("processes") == {identity}
    match = IDENTITY.match(identity)
    assert match is not None
    assert match["host"] == (os.environ.get("DYNO") or socket.gethostname())
    assert int(match["pid"]) == os.getpid()

    fields = r.hgetall(identity)
    for name in ("info", "busy", "beat", "quiet", "rss", "rtt_us", "concurrency"):
        assert name in fields, name
    assert fields["busy"] == "0"
    assert fields["quiet"] == "false"
    assert fields["concurrency"] == "4"
    assert before - 1 <= float(fields["beat"]) <= time.time() + 1
    assert "." in fields["beat"]
    assert int(fields["rss"]) > 0
    assert int(fields["rtt_us"]) >= 0
    assert 0 < r.ttl(identity) <= 60

    info = json.loads(fields["info"])
    assert info["hostname"] == match["host"]
    assert isinstance(info["started_at"], float)
    assert before - 1 <= info["started_at"] <= time.time()
    assert info["pid"] == os.getpid()
    assert info["tag"] == "mytag"
    assert info["concurrency"] == 4
    assert info["queues"] == ["critical", "default"]
    assert info["weights"] == [{"critical": 3, "default": 1}]
    assert info["labels"] == ["blue"]
    assert info["identity"] == identity
    assert info["version"] == __version__
    assert info["embedded"] is False
    assert info["capsules"] == {"default": {"concurrency": 4, "mode": "weighted",
                                            "weights": {"critical": 3, "default": 1}}}

    # It keeps beating.
    first_beat = float(fields["beat"])
    wait_for(lambda: float(r.hget(identity, "beat") or 0) > first_beat)


def test_strict_queues_in_info(r: redis.Redis, config: Config, launch: Launch) -> None:
    config = tuned(config, queues=["a", "b", "a"])
    launcher = launch()
    info = json.loads(r.hget(launcher.identity, "info") or "{}")
    assert info["queues"] == ["a", "b"]
    assert info["capsules"]["default"]["mode"] == "strict"


def test_in_flight_job_in_both_work_hashes(r: redis.Redis, config: Config, launch: Launch,
                                           blocking_job: Any) -> None:
    job, started, release = blocking_job
    config = tuned(config, shutdown_timeout=0.3)
    jid = job.perform_async("x")
    raw = r.lindex("queue:default", -1)
    launcher = launch()
    identity = launcher.identity
    assert started.wait(EVENTUALLY)
    for key in (f"{identity}:workers", f"{identity}:work"):
        entries = wait_for(lambda key=key: r.hgetall(key))
        assert len(entries) == 1
        value = json.loads(next(iter(entries.values())))
        assert value["queue"] == "default"
        assert isinstance(value["payload"], str)
        assert value["payload"] == raw
        assert json.loads(value["payload"])["jid"] == jid
        assert isinstance(value["run_at"], int)
        assert abs(value["run_at"] - time.time()) < 5
        assert 0 < r.ttl(key) <= 60
    wait_for(lambda: r.hget(identity, "busy") == "1")

    # Stop while it still runs: the job goes back, the process says goodbye.
    assert launcher.stop() == 1
    release.set()
    wait_for(lambda: all(not t.is_alive() for t in launcher.manager._threads))
    assert identity not in r.smembers("processes")
    assert not r.exists(f"{identity}:workers")
    assert not r.exists(f"{identity}:work")
    assert r.exists(identity)
    assert 0 < r.ttl(identity) <= 60
    assert r.lrange("queue:default", 0, -1) == [raw]


def test_work_hashes_cleared_when_idle(r: redis.Redis, launch: Launch,
                                       blocking_job: Any) -> None:
    job, started, release = blocking_job
    job.perform_async()
    launcher = launch()
    identity = launcher.identity
    assert started.wait(EVENTUALLY)
    wait_for(lambda: r.exists(f"{identity}:work"))
    release.set()
    wait_for(lambda: not r.exists(f"{identity}:work", f"{identity}:workers"))
    wait_for(lambda: r.hget(identity, "busy") == "0")


def test_stop_flushes_stats_and_leaves(r: redis.Redis, config: Config,
                                       launch: Launch) -> None:
    # only the first beat and the goodbye
    config = tuned(config, heartbeat_interval=30)
    lock = threading.Lock()
    ran: list[int] = []
    name = f"hb_count_{uuid.uuid4().hex}"

    @wurk.job(name=name, retry=False)
    def count(value: int) -> None:
        with lock:
            ran.append(value)
        if value == 0:
            raise ValueError("zero")

    try:
        launcher = launch()
        # The first beat is over (it flushes what has been counted so far) before
        # any job runs; the next one is 30 s away.
        wait_for(lambda: r.exists(launcher.identity), what="the first beat")
        for value in (0, 1, 2):
            count.perform_async(value)
        wait_for(lambda: len(ran) == 3)
        assert int(r.get("stat:processed") or 0) == 0
        launcher.stop()
    finally:
        registry.discard(name)
    assert int(r.get("stat:processed") or 0) == 3
    assert int(r.get("stat:failed") or 0) == 1
    assert launcher.identity not in r.smembers("processes")
    assert r.exists(launcher.identity)
    assert 0 < r.ttl(launcher.identity) <= 60


def test_remote_tstp_quiets_the_process(r: redis.Redis, launch: Launch) -> None:
    launcher = launch()
    identity = launcher.identity
    signal_process(r, identity, "TSTP")
    wait_for(lambda: r.hget(identity, "quiet") == "true")
    assert r.llen(f"{identity}-signals") == 0
    assert launcher.manager.quieting
    wait_for(lambda: all(not t.is_alive() for t in launcher.manager._threads))
    # Still registered and beating, but no longer fetching.
    assert identity in r.smembers("processes")
    r.lpush("queue:default", json.dumps({"class": "Whatever", "args": [], "jid": "0" * 24,
                                         "queue": "default", "retry": True}))
    time.sleep(0.5)
    assert r.llen("queue:default") == 1
    assert r.hget(identity, "quiet") == "true"


def test_remote_term_asks_the_owner_to_stop(r: redis.Redis, launch: Launch) -> None:
    asked = threading.Event()
    launcher = launch(on_stop_request=asked.set)
    signal_process(r, launcher.identity, "TERM")
    assert asked.wait(EVENTUALLY), "on_stop_request was not called"
    # Stopping is the owner's call: the launcher is still up.
    assert not launcher.stopped.is_set()
    assert launcher.identity in r.smembers("processes")


def test_remote_term_without_an_owner_stops_the_launcher(r: redis.Redis,
                                                         launch: Launch) -> None:
    launcher = launch()
    signal_process(r, launcher.identity, "TERM")
    assert launcher.stopped.wait(EVENTUALLY)
    wait_for(lambda: launcher.identity not in r.smembers("processes"))


def test_remote_ttin_dumps_threads_and_unknown_signals_are_ignored(
        r: redis.Redis, launch: Launch) -> None:
    launcher = launch()
    with capture_logs() as logs:
        signal_process(r, launcher.identity, "BOGUS")
        signal_process(r, launcher.identity, "TTIN")
        wait_for(lambda: any(e["event"] == "thread.dump"
                             and e["thread"].startswith("wurk-processor-")
                             for e in logs), timeout=3)
    events = [e["event"] for e in logs]
    assert "heartbeat.unknown_signal" in events
    dumped = {e["thread"] for e in logs if e["event"] == "thread.dump"}
    assert "wurk-heartbeat" in dumped
    assert any(name.startswith("wurk-processor-") for name in dumped)
    assert not launcher.stopped.is_set()
    assert r.hget(launcher.identity, "quiet") == "false"


def test_at_maxmemory_the_beat_lands_and_refused_counts_wait_for_the_next(
        own_redis: RedisServer) -> None:
    client = own_redis.client()
    config = Config(redis_url=own_redis.url, log_level="warning")
    counters, in_flight = Counters(), InFlightTable()
    delivered: list[str] = []
    heartbeat = Heartbeat(config, parse_queues(["default"]), counters=counters,
                          in_flight=in_flight, on_signal=delivered.append)
    try:
        counters.record(failed=True)
        signal_process(client, heartbeat.identity, "TSTP")
        fill_to_maxmemory(client)
        with capture_logs() as logs:
            heartbeat.beat()  # before: OutOfMemoryError from the stats flush
        assert heartbeat.identity in client.smembers("processes")
        assert client.hget(heartbeat.identity, "beat")
        assert delivered == ["TSTP"]
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "heartbeat.flush_failed"]
        assert counters.take() == (1, 1)  # kept for the next beat, not lost
        client.config_set("maxmemory", 0)
        counters.give_back(1, 1)
        heartbeat.beat()
        assert client.get("stat:processed") == client.get("stat:failed") == "1"
    finally:
        close_runtime(config)
        client.close()


def test_quiet_shows_in_the_process_hash_at_once(config: Config, r: redis.Redis,
                                                 launch_with: Callable[..., Launcher]) -> None:
    """Not at the next heartbeat (here 20 s away): Sidekiq's Web and ``wurk
    processes`` show a quieted process as quiet straight away."""
    slow = dataclasses.replace(config, heartbeat_interval=20.0)
    launcher = launch_with(slow)
    assert r.hget(launcher.identity, "quiet") == "false"
    launcher.quiet()
    wait_for(lambda: r.hget(launcher.identity, "quiet") == "true", timeout=5,
             what="quiet written")


def test_a_pulse_hook_passed_to_the_launcher_runs_after_beats_taken_or_failed(
        r: redis.Redis, config: Config, launch_with: Callable[..., Launcher]) -> None:
    """A swarm child's liveness pulse: given at construction, called after every
    beat attempt on the thread, whether Redis took the beat or not."""
    pulses: list[float] = []
    launcher = launch_with(config, on_pulse=lambda: pulses.append(time.monotonic()))
    wait_for(lambda: len(pulses) >= 2, timeout=10, what="pulses after beats")
    assert r.hget(launcher.identity, "beat") is not None
    gone = dataclasses.replace(config, redis_url="redis://127.0.0.1:9/0",
                               redis_retry_attempts=1, redis_connect_timeout=0.2)
    refused: list[float] = []
    plan = parse_queues(["default"])
    beat = Heartbeat(gone, plan, counters=Counters(), in_flight=InFlightTable(),
                     on_signal=lambda _: None, on_pulse=lambda: refused.append(1.0))
    with capture_logs() as logs:
        beat.start()
        try:
            wait_for(lambda: refused, timeout=10, what="a pulse after a failed beat")
        finally:
            beat.stop()
    assert any(e["event"] == "heartbeat.error" for e in logs)

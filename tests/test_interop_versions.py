"""The version matrix (docs/how-to/interop.md): what wurk writes for Sidekiq 6.4-8.1
and what it reads from each.

- Default (``timestamps = "float"``): float-second timestamps, both in-flight
  hash names (``<id>:workers`` for 6.4, ``<id>:work`` for 6.5+), and
  ``concurrency`` both in ``info`` (6.4-8.1.1) and as a hash field (8.1.2+),
  queue weights and mode as Sidekiq 7+ capsules report them.
- ``timestamps = "ms"``: Sidekiq 8's integer milliseconds in payloads, and
  Sidekiq 6.4 (the Ruby here) demonstrably misreads them, so the setting is
  for fleets of Sidekiq 8 only.
- Reading: hand-written 8.x payloads (integer-ms created_at, enqueued_at,
  failed_at, run_at; concurrency only in the hash) are read as times, and
  ``retry_for`` counts from an ms ``failed_at``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer
from test_interop_support import (
    ARGS,
    PY_RUNS,
    assert_exact,
    derive,
    hash_fields,
    launched,
    list_items,
    private_redis,
    python_jobs,
    require_ruby,
    run_ruby,
    wait_run,
    zset_items,
    zset_members,
)
from waiting import wait_for

import wurk
from wurk.api import DeadSet, ProcessSet, Queue, RetrySet, Workers
from wurk.redis.runtime import close_runtime
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

FLOAT_STAMP = r"\d{10}\.\d+"   # epoch seconds with a fraction
MS_STAMP = r"\d{13}"           # epoch milliseconds, an integer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server (see private_redis)."""
    with private_redis() as server:
        yield server


def stamp_of(raw: str, name: str) -> str:
    """The literal JSON text of a timestamp field, so int and float can be told apart."""
    found = re.search(rf'"{name}":(-?[0-9.eE+]+)', raw)
    assert found, f"{name} missing from {raw}"
    return found.group(1)


@pytest.fixture
def jobs(config: Config) -> Iterator[threading.Event]:
    """The Python jobs; set the event to let PySlow finish."""
    with python_jobs(config) as release:
        yield release


def test_default_writes_what_sidekiq_6_4_to_8_1_read(config: Config, r: redis.Redis,
                                                      jobs: threading.Event) -> None:
    client = wurk.Client(config)
    scheduled = client.push({"class": "PyEcho", "args": [1], "at": time.time() + 600})
    with launched(config) as launcher:
        slow = client.push({"class": "PySlow", "args": ARGS})
        failing = client.push({"class": "PyFail", "args": [1]})
        wait_run(r, PY_RUNS, slow)
        wait_for(lambda: r.zcard("retry") == 1 and r.hget(launcher.identity, "busy") == "1",
                 what="retry entry and busy beat")
        identity = launcher.identity

        [(member, score)] = zset_items(r, "schedule")
        assert json.loads(member)["jid"] == scheduled
        assert re.fullmatch(FLOAT_STAMP, stamp_of(member, "created_at"))
        assert re.fullmatch(FLOAT_STAMP, repr(score))
        [retry] = zset_members(r, "retry")
        assert json.loads(retry)["jid"] == failing
        for name in ("created_at", "enqueued_at", "failed_at"):
            assert re.fullmatch(FLOAT_STAMP, stamp_of(retry, name)), name

        # Both in-flight hash names, same content, 60 s TTL: 6.4 reads the
        # first, 6.5+ the second.
        old, new = hash_fields(r, f"{identity}:workers"), hash_fields(r, f"{identity}:work")
        assert old == new and len(new) == 1
        assert 0 < r.ttl(f"{identity}:workers") <= 60 and 0 < r.ttl(f"{identity}:work") <= 60
        [work] = (json.loads(value) for value in new.values())
        assert isinstance(work["payload"], str) and json.loads(work["payload"])["jid"] == slow
        assert isinstance(work["run_at"], int) and work["queue"] == "default"
        payload_raw = work["payload"]
        assert re.fullmatch(FLOAT_STAMP, stamp_of(payload_raw, "enqueued_at"))

        fields = hash_fields(r, identity)
        assert set(fields) >= {"info", "busy", "beat", "quiet", "rss", "rtt_us", "concurrency"}
        assert fields["concurrency"] == str(config.concurrency)  # 8.1.2+ reads this field
        assert re.fullmatch(FLOAT_STAMP, fields["beat"]) and fields["quiet"] == "false"
        info = json.loads(fields["info"])
        assert info["concurrency"] == config.concurrency  # 6.4-8.1.1 read it here
        assert info["queues"] == ["default"] and info["weights"] == [{"default": 0}]
        assert info["capsules"] == {"default": {"concurrency": config.concurrency,
                                                "mode": "strict", "weights": {"default": 0}}}
        assert isinstance(info["version"], str) and info["embedded"] is False
        assert isinstance(info["started_at"], float) and info["identity"] == identity
        jobs.set()
    assert not r.sismember("processes", identity)  # left cleanly
    assert not r.exists(f"{identity}:workers") and not r.exists(f"{identity}:work")


def test_ms_timestamps_write_sidekiq_8_integer_milliseconds(config: Config,
                                                            r: redis.Redis) -> None:
    require_ruby()
    cfg = derive(config, timestamps="ms")
    try:
        with python_jobs(cfg):
            client = wurk.Client(cfg)
            queued = client.push({"class": "PyEcho", "args": ARGS, "queue": "parked"})
            [raw] = list_items(r, "queue:parked")
            for name in ("created_at", "enqueued_at"):
                stamp = stamp_of(raw, name)
                assert re.fullmatch(MS_STAMP, stamp), name
                assert int(stamp) == pytest.approx(time.time() * 1000, abs=10_000)
            client.push({"class": "PyEcho", "args": [1], "at": time.time() + 600})
            [(member, score)] = zset_items(r, "schedule")
            assert re.fullmatch(MS_STAMP, stamp_of(member, "created_at"))
            assert score == pytest.approx(time.time() + 600, abs=10)  # scores stay seconds

            with launched(cfg):
                failing = client.push({"class": "PyFail", "args": [1]})
                wait_for(lambda: r.zcard("retry") == 1, what="retry entry")
                entry = RetrySet(config=cfg).find_job(failing, must_exist=True)
                assert entry is not None
                raw_entry = entry.value.decode() if isinstance(entry.value, bytes) else entry.value
                assert re.fullmatch(MS_STAMP, stamp_of(raw_entry, "failed_at"))
                assert entry.failed_at == pytest.approx(time.time(), abs=10)  # read back as ms
                assert entry.retry()  # a second failure stamps retried_at, in ms too
                wait_for(lambda: "retried_at" in "".join(zset_members(r, "retry")),
                         what="second failure")
                [again] = zset_members(r, "retry")
                assert re.fullmatch(MS_STAMP, stamp_of(again, "retried_at"))
                assert json.loads(again)["retry_count"] == 0  # 0, retry() -1, failed again 0
    finally:
        close_runtime(cfg)
    # Why "ms" is for Sidekiq 8 fleets only: 6.4 takes the integer as seconds.
    dump = run_ruby(config.redis_url, "api.rb", "dump")
    [parked] = [q for q in dump["queues"] if q["name"] == "parked"]
    assert parked["jobs"][0]["jid"] == queued
    assert parked["latency"] < -1e9  # "enqueued" tens of thousands of years from now


def sidekiq_8_job(**fields: Any) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    return {"retry": True, "queue": "default", "args": ARGS, "class": "PyEcho",
            "jid": new_jid(), "created_at": now_ms - 5000, "enqueued_at": now_ms - 5000,
            **fields}


def test_wurk_reads_sidekiq_8_integer_ms_payloads(config: Config, r: redis.Redis,
                                                   jobs: threading.Event) -> None:
    job = sidekiq_8_job()
    raw = json.dumps(job, ensure_ascii=False)
    r.sadd("queues", "default")
    r.lpush("queue:default", raw)
    [record] = list(Queue("default", config=config))
    assert record.enqueued_at == pytest.approx(time.time() - 5, abs=2)
    assert record.created_at == pytest.approx(time.time() - 5, abs=2)
    assert Queue("default", config=config).latency == pytest.approx(5, abs=2)

    hour_ago_ms = int((time.time() - 7200) * 1000)
    failed = sidekiq_8_job(**{"class": "PyFail", "args": [1], "retry_count": 0,
                              "failed_at": hour_ago_ms, "error_class": "RuntimeError",
                              "error_message": "from sidekiq 8", "retry_for": 3600})
    r.zadd("retry", {json.dumps(failed): time.time() + 600})
    [entry] = RetrySet(config=config)
    assert entry.failed_at == pytest.approx(time.time() - 7200, abs=2)

    with launched(config):
        [run] = wait_run(r, PY_RUNS, job["jid"])
        assert_exact(run["args"], ARGS)
        assert run["job"]["created_at"] == job["created_at"]  # kept as Sidekiq 8 wrote it
        # Retried by wurk, it fails again: failed_at (ms) + retry_for (1 h) is
        # past, so it is exhausted and dies. Read as seconds it would retry.
        asked = time.time()
        assert entry.retry()
        wait_for(lambda: r.zcard("dead") == 1, what="the exhausted job in dead")
        died = time.time()
    [dead] = DeadSet(config=config)
    # retry_count: 0, then -1 from the API's retry, then 0 from this failure.
    assert (dead.jid, dead.retry_count, r.zcard("retry")) == (failed["jid"], 0, 0)
    # Stamped by the failure after the retry (ms may round down), and the
    # first failure's time kept: bounds from the events, not from how long
    # the run above took.
    assert asked - 0.01 <= dead.retried_at <= died + 0.01
    assert dead.failed_at == pytest.approx(hour_ago_ms / 1000, abs=0.01)


def test_wurk_reads_a_sidekiq_8_1_process(config: Config, r: redis.Redis) -> None:
    identity = "web-1:4242:0123456789ab"
    info = {"hostname": "web-1", "started_at": time.time() - 60, "pid": 4242, "tag": "app",
            "queues": ["critical", "default"], "weights": [{"critical": 0, "default": 0}],
            "labels": ["ruby"], "identity": identity, "version": "8.1.7", "embedded": False,
            "capsules": {"default": {"concurrency": 7, "mode": "strict",
                                     "weights": {"critical": 0, "default": 0}}}}
    r.sadd("processes", identity)
    r.hset(identity, mapping={"info": json.dumps(info), "busy": 1, "beat": repr(time.time()),
                              "quiet": "false", "rss": 51200, "rtt_us": 90,
                              "concurrency": 7})  # 8.1.2+: only here, not in info
    r.expire(identity, 60)
    job = json.dumps(sidekiq_8_job())
    r.hset(f"{identity}:work", "tid-1", json.dumps(
        {"queue": "default", "payload": job, "run_at": int(time.time() * 1000)}))
    [process] = ProcessSet(config=config)
    assert (process.identity, process.concurrency, process.version) == (identity, 7, "8.1.7")
    assert (process.queues, process.busy, process.labels) == (["critical", "default"], 1,
                                                              ["ruby"])
    [(_, thread, work)] = Workers(config=config)
    assert thread == "tid-1" and work.job.klass == "PyEcho"
    assert work.run_at == pytest.approx(time.time(), abs=5)  # ms read as ms


@pytest.mark.parametrize(("queues", "mode", "weights"), [
    (["default"], "strict", {"default": 0}),
    (["a", "b:0"], "strict", {"a": 0, "b": 0}),
    (["a:1", "b:1"], "random", {"a": 1, "b": 1}),
    (["a:3", "b:1"], "weighted", {"a": 3, "b": 1}),
])
def test_queue_modes_are_reported_as_sidekiq_7_capsules_do(
        config: Config, queues: list[str], mode: str, weights: dict[str, int]) -> None:
    # Sidekiq 7+: strict order means every weight is 0; all weights 1 is "random".
    cfg = derive(config, queues=queues)
    info = Launcher(cfg).heartbeat.info
    assert info["capsules"]["default"] == {"concurrency": cfg.concurrency, "mode": mode,
                                           "weights": weights}
    assert info["weights"] == [weights] and info["queues"] == list(weights)
    close_runtime(cfg)

"""wurk.api Workers: jobs in flight per process and thread (spec §9.3)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from test_api_support import (
    RUBY_IDENTITY,
    RUBY_INFO,
    RUBY_JOB,
    launched,
    recording_job,
    ruby_heartbeat,
)
from waiting import wait_for

from wurk.api import Work, WorkEntry, Workers
from wurk.settings.config import Config

MODERN = "web-1:4242:0123456789ab"


def test_reads_6_4_workers_with_string_and_object_payloads(config: Config,
                                                           r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=2)
    r.hset(f"{RUBY_IDENTITY}:workers", mapping={
        "69x": json.dumps({"queue": "other", "payload": RUBY_JOB, "run_at": 1796022187}),
        "6a1": json.dumps({"queue": "default", "payload": json.loads(RUBY_JOB),
                           "run_at": 1796022100}),
    })
    entries = list(Workers(config=config))
    assert [(e.process, e.thread) for e in entries] == [(RUBY_IDENTITY, "6a1"),
                                                        (RUBY_IDENTITY, "69x")]  # by run_at
    work = entries[1].work
    assert isinstance(entries[1], WorkEntry) and isinstance(work, Work)
    assert (work.queue, work.run_at) == ("other", 1796022187.0)
    assert work.payload == json.loads(RUBY_JOB) == entries[0].work.payload
    assert work["queue"] == "other" and work["payload"]["jid"] == "f24f20b2e4a09e8a29747db5"
    assert (work.job.klass, work.job.args) == ("WurkEcho", [1, "two", {"three": 3}])
    assert Workers(config=config).size == 2


def test_prefers_the_6_5_work_hash_and_skips_expired_processes(config: Config,
                                                               r: redis.Redis) -> None:
    ruby_heartbeat(r, MODERN, {**RUBY_INFO, "identity": MODERN}, busy=1)
    r.hset(f"{MODERN}:work", "t1", json.dumps({"queue": "default", "payload": RUBY_JOB,
                                               "run_at": int(time.time() * 1000)}))
    r.hset(f"{MODERN}:workers", "stale", json.dumps({"queue": "old", "payload": RUBY_JOB,
                                                     "run_at": 1}))
    r.sadd("processes", "ghost:1:deadbeef0000")  # its work hash outlived its heartbeat
    r.hset("ghost:1:deadbeef0000:work", "t9", json.dumps({"queue": "x", "payload": RUBY_JOB,
                                                          "run_at": 5}))
    [(identity, thread, work)] = Workers(config=config)
    assert (identity, thread, work.queue) == (MODERN, "t1", "default")
    assert work.run_at == pytest.approx(time.time(), abs=2)  # Sidekiq 8 ms read as seconds


def test_size_sums_busy_not_hash_lengths(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=4)
    ruby_heartbeat(r, MODERN, {**RUBY_INFO, "identity": MODERN}, busy=3)
    assert Workers(config=config).size == len(Workers(config=config)) == 7
    assert list(Workers(config=config)) == []


def test_skips_unreadable_entries(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=1)
    r.hset(f"{RUBY_IDENTITY}:work", mapping={
        "bad": "not json", "deep": "[" * 100_000,
        "ok": json.dumps({"queue": "q", "payload": "also not json", "run_at": 3}),
        "ok2": json.dumps({"queue": "q", "payload": "[" * 100_000, "run_at": 3})})
    entries = sorted(Workers(config=config), key=lambda e: e.thread)
    assert [(e.thread, e.work.payload) for e in entries] == [("ok", {}), ("ok2", {})]


def test_shows_the_jobs_a_real_launcher_is_running(config: Config) -> None:
    release = threading.Event()
    with recording_job(block=release) as (job, runs), launched(config) as launcher:
        pushed = time.time()
        jids = {job.perform_async(i) for i in range(2)}
        wait_for(lambda: len(runs) == 2)
        entries = wait_for(lambda: (found := list(Workers(config=config))) and
                           len(found) == 2 and found)
        assert {e.process for e in entries} == {launcher.identity}
        assert {e.work.payload["jid"] for e in entries} == jids
        assert {e.work.queue for e in entries} == {"default"}
        # Started after the push (whole seconds), however long the listing took.
        assert all(int(pushed) <= e.work.run_at <= time.time() for e in entries)
        assert len({e.thread for e in entries}) == 2
        wait_for(lambda: Workers(config=config).size == 2)  # busy lands a moment later
        release.set()
        wait_for(lambda: list(Workers(config=config)) == [])

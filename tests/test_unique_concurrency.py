"""Unique jobs under concurrency, on a real redis-server: many threads and
several forked processes push the same job at once and exactly one is
enqueued, in every ``unique_until`` mode, single, bulk and scheduled; after
each mode's release a new push goes through."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from waiting import wait_for

import wurk
from wurk.push.client import Client
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config
from wurk.unique.keys import lock_key

Define = Callable[..., Any]
Launch = Callable[..., Launcher]
THREADS = 24
PROCESSES = 4


def at_once(count: int, push: Callable[[], Any]) -> list[Any]:
    """``push`` from ``count`` threads released together; their results."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        barrier.wait(10)
        results[i] = push()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def forked_at_once(processes: int, threads: int, start_at: float,
                   push: Callable[[], Any]) -> list[Any]:
    """``push`` from ``threads`` threads in each of ``processes`` forked children."""
    children = []
    for _ in range(processes):
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(rfd)
                time.sleep(max(0.0, start_at - time.time()))
                os.write(wfd, json.dumps(at_once(threads, push)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        children.append((pid, rfd))
    results: list[Any] = []
    for pid, rfd in children:
        chunks = []
        while chunk := os.read(rfd, 65536):
            chunks.append(chunk)
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        results.extend(json.loads(b"".join(chunks)))
    return results


def enqueued(r: redis.Redis) -> list[str]:
    return [json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)]


def one_winner(results: list[Any]) -> str:
    winners = [jid for jid in results if jid is not None]
    assert len(winners) == 1, winners
    return str(winners[0])


@pytest.mark.parametrize("until", ["success", "start", "expiry"])
def test_threads_then_processes_push_one_job_at_once_and_exactly_one_is_enqueued(
        until: str, config: Config, r: redis.Redis, define: Define, launch: Launch) -> None:
    done = threading.Event()
    job = define(lambda n: done.set(), unique_for=30, unique_until=until)
    first = one_winner(at_once(THREADS, lambda: job.perform_async(1)))
    assert enqueued(r) == [first]
    worker = launch()
    assert done.wait(10)
    wait_for(lambda: int(r.get("stat:processed") or 0) == 1)
    worker.stop(time.monotonic() + 5)
    key = lock_key(job.name, "default", [1])
    if until == "expiry":
        # Never released early: a push is still a duplicate until the lock expires.
        assert job.perform_async(1) is None and r.get(key) == first
        r.pexpire(key, 100)  # the rest of unique_for passes
    wait_for(lambda: not r.exists(key))
    wurk.Client._default = None  # each child builds its own after the fork
    second = one_winner(forked_at_once(PROCESSES, THREADS // 2, time.time() + 0.3,
                                       lambda: job.perform_async(1)))
    assert second != first and enqueued(r) == [second]
    assert r.get(key) == second


def test_forked_pushers_hold_one_lock_against_each_other(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda n: None, unique_for=30)
    results = forked_at_once(PROCESSES, 8, time.time() + 0.3, lambda: job.perform_async(7))
    winner = one_winner(results)
    assert enqueued(r) == [winner]
    assert r.get(lock_key(job.name, "default", [7])) == winner


def test_concurrent_bulk_pushes_enqueue_each_job_once(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda n: None, unique_for=30)
    batches = at_once(8, lambda: job.perform_bulk([[i] for i in range(50)] + [[0], [1]]))
    assert sum(len(b) for b in batches) == 50
    assert sorted(json.loads(raw)["args"][0] for raw in r.lrange("queue:default", 0, -1)) == \
        list(range(50))


def test_concurrent_scheduled_pushes_schedule_one(
        config: Config, r: redis.Redis, define: Define) -> None:
    job = define(lambda n: None, unique_for=30)
    winner = one_winner(at_once(THREADS, lambda: job.perform_in(60, 1)))
    [member] = r.zrange("schedule", 0, -1)
    assert json.loads(member)["jid"] == winner
    # The raw client too, with a Sidekiq-style item.
    client = Client(config)
    results = at_once(THREADS, lambda: client.push(
        {"class": "Raw", "args": [1], "unique_for": 30, "at": time.time() + 60}))
    one_winner(results)
    assert r.zcard("schedule") == 2

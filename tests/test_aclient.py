"""The asyncio client (wurk.push.aclient): the same payloads, checks and
unique locks as the sync client, against a real redis-server.

Coroutines run with ``asyncio.run`` inside plain tests: no pytest plugin.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from tuning import tuned

import wurk
from wurk.batches import keys as batch_keys
from wurk.push import middleware
from wurk.push.client import BULK_BATCH, Client
from wurk.push.job import JobFunction
from wurk.redis.pool import RedisPool
from wurk.settings.config import Config
from wurk.wire.payload import ArgumentError

T = TypeVar("T")
Define = Callable[..., JobFunction[..., Any]]
# Set at push time: equal in kind, not in value, between two pushes.
STAMPS = ("jid", "created_at", "enqueued_at")


def run(make: Callable[[wurk.AsyncClient], Awaitable[T]], config: Config | None = None,
        **kwargs: Any) -> T:
    """Run ``make(client)`` on a fresh loop with a fresh AsyncClient; both it and
    the loop's default client are closed after."""
    async def main() -> T:
        try:
            async with wurk.AsyncClient(config, **kwargs) as client:
                return await make(client)
        finally:
            # The job verbs push through the loop's default client: close it too.
            await wurk.AsyncClient.default().aclose()
    return asyncio.run(main())


def queued(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(r.lrange(f"queue:{queue}", 0, -1))]


def scheduled(r: redis.Redis) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(m), s) for m, s in r.zrange("schedule", 0, -1, withscores=True)]


def same_payload(sync: dict[str, Any], aio: dict[str, Any]) -> None:
    """Field by field: every field equal, the per-push stamps of the same type."""
    assert sorted(sync) == sorted(aio)
    for field in sync:
        if field in STAMPS:
            assert type(sync[field]) is type(aio[field]), field
        else:
            assert sync[field] == aio[field], field


def job(a: int, b: str = "x") -> None:
    """A job with a signature the pushes are checked against."""


def test_an_async_push_writes_the_payload_the_sync_client_writes(
        config: Config, r: redis.Redis, define: Define) -> None:
    fn = define(job, queue="mail", retry=3, tags=["a"], backtrace=5)
    fn.perform_async(1, "y")
    run(lambda _: fn.aperform_async(1, "y"))
    sync, aio = queued(r, "mail")
    same_payload(sync, aio)
    assert aio["args"] == [1, "y"] and aio["queue"] == "mail" and aio["retry"] == 3
    assert r.smembers("queues") == {"mail"}
    assert sync["jid"] != aio["jid"]


def test_scheduled_pushes_match_and_keep_sidekiqs_perform_in_rule(
        config: Config, r: redis.Redis, define: Define) -> None:
    fn = define(job)
    at = time.time() + 3600
    sync = fn.perform_at(at, 1)
    jids = run(lambda _: asyncio.gather(
        fn.aperform_at(at, 1), fn.aperform_in(60, 2),
        fn.aperform_at(datetime.fromtimestamp(at + 1, UTC), 3),
        fn.aperform_in(at + 2, 4)))  # over 1e9: an epoch, as in Sidekiq
    by_jid = {p["jid"]: p for p, _ in scheduled(r)}
    same_payload(by_jid[sync], by_jid[jids[0]])
    entries = {p["args"][0]: (p, score) for p, score in scheduled(r)}
    assert entries[2][1] == pytest.approx(time.time() + 60, abs=5)
    assert entries[3][1] == pytest.approx(at + 1) and entries[4][1] == pytest.approx(at + 2)
    assert "enqueued_at" not in entries[2][0] and r.llen("queue:default") == 0


def test_a_naive_datetime_is_refused_before_anything_is_sent(
        config: Config, r: redis.Redis, define: Define) -> None:
    fn = define(job)
    with pytest.raises(ArgumentError, match="timezone-aware"):
        run(lambda _: fn.aperform_at(datetime(2030, 1, 1), 1))
    with pytest.raises(ArgumentError):
        run(lambda _: fn.aperform_async(1, 2, 3, 4))  # too many for job(a, b)
    with pytest.raises(TypeError, match="'a' must be int, got object"):
        run(lambda _: fn.aperform_async(object()))  # annotated int: refused by its type

    assert r.dbsize() == 0


def test_bulk_pushes_every_slice_with_one_time_each(config: Config, r: redis.Redis,
                                                    define: Define) -> None:
    fn = define(job, queue="bulk")
    count = 2 * BULK_BATCH + 7
    jids = run(lambda _: fn.aperform_bulk([[i] for i in range(count)]))
    jobs = queued(r, "bulk")
    assert [p["jid"] for p in jobs] == jids and len(set(jids)) == count
    assert [p["args"] for p in jobs] == [[i] for i in range(count)]
    sync_one = Client(config).push_bulk({"class": fn.name, "args": [[0]], "queue": "bulk"})
    same_payload(queued(r, "bulk")[-1], jobs[0])
    assert sync_one
    base = time.time() + 1000
    ats = [base + i for i in range(5)]
    run(lambda c: c.push_bulk({"class": fn.name, "args": [[i] for i in range(5)], "at": ats}))
    assert [s for _, s in scheduled(r)] == pytest.approx(ats)


def test_bulk_checks_every_job_before_writing_any(config: Config, r: redis.Redis,
                                                  define: Define) -> None:
    fn = define(job)
    with pytest.raises(ArgumentError, match=r"args\[1500\]"):
        run(lambda _: fn.aperform_bulk([[i] for i in range(1500)] + [[1, 2, 3]]))
    with pytest.raises(ValueError, match="one time per job"):
        run(lambda c: c.push_bulk({"class": "X", "args": [[1], [2]], "at": [1.0]}))
    assert r.dbsize() == 0


def test_unique_jobs_dedupe_across_sync_and_async_pushers(config: Config, r: redis.Redis,
                                                          define: Define) -> None:
    fn = define(job, unique_for=60)
    first = fn.perform_async(1)
    assert first is not None
    assert run(lambda _: fn.aperform_async(1)) is None  # the sync push holds the lock
    aio = run(lambda _: fn.aperform_async(2))
    assert aio is not None and fn.perform_async(2) is None  # and the other way round
    pushed = run(lambda _: fn.aperform_bulk([[1], [2], [3], [3]]))
    assert len(pushed) == 1  # 1 and 2 held; the second 3 is a duplicate of the first
    assert sorted(p["args"][0] for p in queued(r)) == [1, 2, 3]
    assert all(p["unique_lock"].startswith("unique:") for p in queued(r))


def test_a_failed_write_gives_the_unique_lock_back(config: Config, r: redis.Redis,
                                                   define: Define) -> None:
    fn = define(job, unique_for=60)
    r.set("queue:default", "not a list")  # the LPUSH meets WRONGTYPE
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        run(lambda _: fn.aperform_async(1), buffered=False)
    assert not list(r.scan_iter("unique:*"))
    r.delete("queue:default")
    assert fn.perform_async(1) is not None  # not refused as its own duplicate


def test_client_middleware_runs_and_may_stop_or_change_a_push(config: Config,
                                                               r: redis.Redis) -> None:
    seen: list[tuple[str, str, Any]] = []

    def mw(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
           call_next: Callable[[], Any]) -> None:
        seen.append((job_class, queue, redis_))
        if payload["args"] == ["stop"]:
            return
        payload["args"] = [*payload["args"], "seen"]
        payload["at"] = payload.get("at")  # a middleware may touch ``at``
        call_next()

    config = tuned(config, client_middleware=[mw])

    async def pushes(client: wurk.AsyncClient) -> list[Any]:
        return [await client.push({"class": "Echo", "args": ["go"]}),
                await client.push({"class": "Echo", "args": ["stop"]}),
                await client.push_bulk({"class": "Echo", "args": [["b1"], ["stop"]]})]

    go, stopped, bulk = run(pushes)
    assert stopped is None and go is not None and len(bulk) == 1
    assert [p["args"] for p in queued(r)] == [["go", "seen"], ["b1", "seen"]]
    assert [s[:2] for s in seen] == [("Echo", "default")] * 4
    assert all(isinstance(s[2], RedisPool) for s in seen)  # the sync pool, as documented


def test_many_coroutines_push_at_once_through_a_small_pool(
        redis_server: Any, r: redis.Redis, define: Define) -> None:
    config = Config(redis_url=redis_server.url, redis_pool_size=3, log_level="warning")
    fn = define(job)

    async def pushes(client: wurk.AsyncClient) -> list[str | None]:
        enqueuer = fn.set(client=client)
        singles = [enqueuer.aperform_async(i) for i in range(400)]
        bulks = [enqueuer.aperform_bulk([[i] for i in range(50)]) for _ in range(4)]
        done = await asyncio.gather(*singles, *bulks)
        return [j for one in done for j in (one if isinstance(one, list) else [one])]

    jids = run(pushes, config)
    assert len(jids) == 600 and len(set(jids)) == 600 and None not in jids
    assert sorted(p["jid"] for p in queued(r)) == sorted(jids)  # type: ignore[type-var]


def test_an_enqueuer_bound_to_one_kind_of_client_refuses_the_other(
        config: Config, r: redis.Redis, define: Define) -> None:
    fn = define(job)
    with pytest.raises(TypeError, match="aperform_async"):
        run(lambda c: asyncio.sleep(0, fn.set(client=c).perform_async(1)))
    with pytest.raises(TypeError, match="sync Client"):
        run(lambda _: fn.set(client=Client(config)).aperform_async(1))
    assert r.dbsize() == 0


def test_class_jobs_have_the_awaitable_verbs(config: Config, r: redis.Redis) -> None:
    class Mailer(wurk.Job, name="t_aclient_mailer", queue="mail"):
        def perform(self, to: str) -> None:
            pass

    try:
        at = time.time() + 100
        jids = run(lambda _: asyncio.gather(
            Mailer.aperform_async("a"), Mailer.aperform_in(50, "b"),
            Mailer.aperform_at(at, "c"), Mailer.aperform_bulk([["d"], ["e"]])))
        # The coroutines race on separate connections: any order.
        assert sorted(p["args"] for p in queued(r, "mail")) == [["a"], ["d"], ["e"]]
        assert len(scheduled(r)) == 2 and jids[0] is not None
    finally:
        wurk.registry.discard("t_aclient_mailer")


def test_the_default_client_is_per_loop_and_follows_configure(
        config: Config, r: redis.Redis) -> None:
    async def defaults() -> tuple[wurk.AsyncClient, wurk.AsyncClient]:
        return wurk.AsyncClient.default(), wurk.AsyncClient.default()

    first, again = asyncio.run(defaults())
    assert first is again and first.config is config
    other, _ = asyncio.run(defaults())
    assert other is not first  # a new loop, a new client (the old one's loop is gone)
    new = wurk.configure(Config(redis_url=config.redis_url, log_level="warning"))
    assert asyncio.run(defaults())[0].config is new


def test_the_async_enqueue_example_runs(redis_server: Any, r: redis.Redis) -> None:
    env = {**os.environ, "REDIS_URL": redis_server.url}
    done = subprocess.run([sys.executable, "-W", "error", "-m", "examples.async_enqueue", "3"],
                          cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "expected: jobs=9"
    in_queues = sum(r.llen(f"queue:{q}") for q in r.smembers("queues"))
    assert in_queues + r.zcard("schedule") == 9 and r.zcard("schedule") == 1


def test_the_built_in_steps_of_an_async_push_stay_on_the_loop(
        config: Config, r: redis.Redis, define: Define) -> None:
    # Every built-in step (the unique lock, the batch count of a buffered
    # push) goes through the AsyncClient's own pool: no worker thread, no sync pool.
    before = set(threading.enumerate())
    fn = define(job, unique_for=60)
    assert run(lambda _: fn.aperform_async(1)) is not None
    assert run(lambda _: fn.aperform_async(1)) is None  # still deduplicated
    b = wurk.Batch()

    async def counted(client: wurk.AsyncClient) -> tuple[str | None, list[str]]:
        jid = await client.push({"class": "Batched", "args": [1], "bid": b.bid})
        # Seen before the loop closes: asyncio.run ends its worker threads.
        return jid, [t.name for t in set(threading.enumerate()) - before]

    pushed, started = run(counted, buffered=True)
    assert pushed in set(r.smembers(batch_keys.key(b.bid, batch_keys.PENDING)))
    assert [name for name in started if name.startswith("asyncio_")] == []
    assert len(queued(r)) == 2


def test_time_results_and_batch_fields_match_the_sync_clients(
        config: Config, r: redis.Redis, define: Define) -> None:
    fn = define(job, expires_in=600, timeout=30, store_result=True, result_ttl=120)
    fn.perform_async(1)
    run(lambda _: fn.aperform_async(1))
    sync, aio = queued(r)
    same_payload({k: v for k, v in sync.items() if k != "expiry"},
                 {k: v for k, v in aio.items() if k != "expiry"})
    # Stamped from each push's own clock: the run time plus expires_in.
    assert aio["expiry"] == pytest.approx(time.time() + 600, abs=5)
    assert aio["result_ttl"] == 120 and sync["result_ttl"] == 120
    r.delete("queue:default")
    b = wurk.Batch()
    item = {"class": "Batched", "args": [1]}
    sync_jid = Client(config).push({**item, "bid": b.bid})
    aio_jid = run(lambda client: client.push({**item, "bid": b.bid}))
    sync, aio = queued(r)
    same_payload(sync, aio)
    counted = set(r.smembers(batch_keys.key(b.bid, batch_keys.PENDING)))
    assert {sync_jid, aio_jid} <= counted  # the batch step ran for the async push too


class Deferring:
    """Keeps pushes until ``release``; lets through the ones it resumes."""

    def __init__(self, only: int | None = None) -> None:
        self.later: list[Callable[[], object]] = []
        self.only = only  # defer just the job whose first argument is this
        self.releasing = False

    def __call__(self, job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], Any]) -> None:
        if self.releasing or (self.only is not None and payload["args"][0] != self.only):
            call_next()
            return
        self.later.append(middleware.defer())


def test_a_deferred_push_gives_its_jid_and_is_written_from_another_thread(
        config: Config, r: redis.Redis) -> None:
    deferring = Deferring()
    seen: list[object] = []

    async def push_then_release(client: wurk.AsyncClient) -> str | None:
        jid = await client.push({"class": "Later", "args": [1]})
        assert queued(r) == []
        deferring.releasing = True
        # As Django's on_commit would: a sync call on another thread.
        await asyncio.to_thread(lambda: seen.append(deferring.later[0]()))
        return jid

    jid = run(push_then_release, config, middleware=[deferring])
    assert seen == [jid] and [p["jid"] for p in queued(r)] == [jid]


def test_a_deferred_push_resumed_on_the_loop_runs_as_a_task(
        config: Config, r: redis.Redis) -> None:
    deferring = Deferring()

    async def push_then_release(client: wurk.AsyncClient) -> tuple[str | None, object]:
        jid = await client.push({"class": "Later", "args": [1]})
        deferring.releasing = True
        task = deferring.later[0]()
        assert isinstance(task, asyncio.Task)
        return jid, await task

    jid, written = run(push_then_release, config, middleware=[deferring])
    assert written == jid and [p["jid"] for p in queued(r)] == [jid]


def test_bulk_keeps_a_deferred_jid_in_its_place(config: Config, r: redis.Redis) -> None:
    deferring = Deferring(only=2)

    async def bulk(client: wurk.AsyncClient) -> list[str]:
        return await client.push_bulk({"class": "Later", "args": [[1], [2], [3]]})

    jids = run(bulk, config, middleware=[deferring])
    written = {p["args"][0]: p["jid"] for p in queued(r)}
    assert len(jids) == 3 and sorted(written) == [1, 3]
    assert jids[0] == written[1] and jids[2] == written[3] and jids[1] not in written.values()


def test_resuming_after_the_loop_closed_is_a_clear_error(config: Config, r: redis.Redis) -> None:
    deferring = Deferring()
    run(lambda client: client.push({"class": "Later", "args": [1]}), config,
        middleware=[deferring])
    deferring.releasing = True
    with pytest.raises(RuntimeError, match="event loop is closed"):
        deferring.later[0]()
    assert queued(r) == []

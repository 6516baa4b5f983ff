"""Batches under faults: a lost reply or a broken connection while a batch
job is written. A plain write counts and writes in one script, so the job
and its count land together or not at all; a write whose outcome is unknown
gives back neither its count nor its unique lock. Real Redis, the fault
proxy, and a pool that raises after the command was sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import admin_cli
import pytest
import redis
import redis.exceptions as rx
from admin_cli import Cli
from structlog.testing import capture_logs
from waiting import wait_for

import wurk
from tests.faultproxy import FaultProxy
from wurk.batches import push as batch_push
from wurk.batches.api import BatchStatus
from wurk.push import prepare
from wurk.push.job import JobFunction
from wurk.redis.apool import AsyncRedisPool
from wurk.redis.pool import RedisPool
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.push_lua import PUSH_MARKED

Define = Callable[..., JobFunction[..., Any]]
cli = admin_cli.cli
keep_logging = admin_cli.keep_logging


def settings(url: str) -> Config:
    return Config(redis_url=url, redis_connect_timeout=0.3, redis_retry_base=0.01,
                  redis_retry_attempts=3, log_level="warning")


class Watched:
    """A connection that notes the first two words of each command sent through it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sent: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(args[:2])
        return self.conn.call(*args, **kwargs)

    def script(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        self.sent.append(("EVALSHA", script.sha))
        return self.conn.script(script, keys, args)

    def pipeline(self, commands: Any, **kwargs: Any) -> Any:
        self.sent.extend(tuple(command[:2]) for command in commands)
        return self.conn.pipeline(commands, **kwargs)

    @property
    def wrote_jobs(self) -> bool:
        """Whether a plain job write went through: one that sets a push mark,
        or the checked push (PUSH_MARKED)."""
        return any(sent == ("EVALSHA", PUSH_MARKED.sha)
                   or (sent[0] == "SET" and str(sent[1]).startswith(keys.PUSH_MARK_PREFIX))
                   for sent in self.sent if len(sent) == 2)


class LosesReply:
    """A pool that, once armed, runs the next block that writes jobs (a plain
    write, or any non-idempotent block) and then raises as if the connection
    broke before the reply came back: the write applied."""

    def __init__(self, real: RedisPool) -> None:
        self.real = real
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, block: Callable[[Any], Any], *, idempotent: bool = False,
            attempts: int | None = None) -> Any:
        def watched(conn: Any) -> Any:
            seen = Watched(conn)
            result = block(seen)
            if self.armed and (seen.wrote_jobs or not idempotent):
                self.armed = False
                raise rx.ConnectionError("the reply was lost")
            return result

        return self.real.run(watched, idempotent=idempotent, attempts=attempts)

    def pipeline(self, commands: Any, *, transaction: bool = False, idempotent: bool = False,
                 attempts: int | None = None) -> list[Any]:
        return self.run(lambda c: c.pipeline(commands, transaction=transaction),
                        idempotent=idempotent, attempts=attempts)

    def call(self, *args: Any, idempotent: bool = False) -> Any:
        return self.run(lambda c: c.call(*args), idempotent=idempotent)


def queued_args(r: redis.Redis) -> list[Any]:
    return sorted(json.loads(raw)["args"][0] for raw in r.lrange("queue:default", 0, -1))


def test_a_lost_reply_leaves_the_job_and_its_count_together(
        proxy: FaultProxy, r: redis.Redis, config: Config, cli: Cli) -> None:
    client = wurk.Client(settings(proxy.url), buffered=False, drain_spool=False)
    batch = wurk.Batch("lost reply", client=client)
    batch.push({"class": "Echo", "args": ["warm"]})
    proxy.drop_next_reply()  # Redis ran the script; the client never hears back
    with capture_logs() as logs, pytest.raises(rx.ConnectionError):
        batch.push({"class": "Echo", "args": ["maybe"], "jid": "maybe0000000000000000001"})
    assert queued_args(r) == ["maybe", "warm"]
    assert r.sismember(f"b-{batch.bid}-jids", "maybe0000000000000000001")
    assert r.hget(f"b-{batch.bid}", "total") == "2"
    assert any(e["event"] == "client.write_outcome_unknown" for e in logs)
    # A request that never reached Redis: neither the job nor its count.
    batch.push({"class": "Echo", "args": ["warm again"]})
    proxy.drop_next_request()
    with pytest.raises(rx.ConnectionError):
        batch.push({"class": "Echo", "args": ["never"]})
    assert queued_args(r) == ["maybe", "warm", "warm again"]
    assert r.hget(f"b-{batch.bid}", "total") == "3"
    batch.commit()
    status = BatchStatus.read(batch.bid, config=config)
    assert status.pending == 3 and not status.complete  # waits for the jobs to run
    assert "maybe0000000000000000001" in status.pending_jids
    shown = cli("batches", "show", batch.bid)
    assert "waiting on:" in shown.out and "maybe0000000000000000001" in shown.out


def test_an_unknown_outcome_keeps_the_unique_lock_and_the_count(
        r: redis.Redis, config: Config) -> None:
    pool = LosesReply(RedisPool.from_config(config))
    client = wurk.Client(config, pool=pool, buffered=False, drain_spool=False)  # type: ignore[arg-type]
    batch = wurk.Batch("unique", client=client)
    pool.armed = True
    with pytest.raises(rx.ConnectionError):
        batch.push({"class": "Echo", "args": ["once"], "unique_for": 60})
    assert queued_args(r) == ["once"]
    assert len(list(r.scan_iter("unique:*"))) == 1  # not given back: the job landed
    assert r.scard(f"b-{batch.bid}-jids") == 2  # the job and the builder's hold
    # The duplicate is refused, as it should be: the first one is queued.
    assert batch.push({"class": "Echo", "args": ["once"], "unique_for": 60}) is None


@pytest.mark.parametrize("buffered", [True, False])
def test_a_refused_write_gives_back_everything(r: redis.Redis, config: Config,
                                               buffered: bool) -> None:
    client = wurk.Client(config, buffered=buffered, drain_spool=False)
    batch = wurk.Batch("refused", client=client)
    r.set("queue:default", "not a list")  # the LPUSH meets WRONGTYPE: nothing written
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        batch.push({"class": "Echo", "args": ["no"], "unique_for": 60})
    assert not list(r.scan_iter("unique:*"))
    assert r.hget(f"b-{batch.bid}", "total") == "0"
    assert r.smembers(f"b-{batch.bid}-jids") == {batch._hold}


def test_a_buffered_push_counts_first_and_keeps_its_count_when_the_reply_is_lost(
        r: redis.Redis, config: Config) -> None:
    pool = LosesReply(RedisPool.from_config(config))
    client = wurk.Client(config, pool=pool, buffered=True, drain_spool=False)  # type: ignore[arg-type]
    assert client.buffer is not None
    batch = wurk.Batch("buffered", client=client)
    pool.armed = True
    with pytest.raises(wurk.PushOutcomeUnknown):
        batch.push({"class": "Echo", "args": ["landed"], "unique_for": 60})
    assert queued_args(r) == ["landed"]
    assert r.hget(f"b-{batch.bid}", "total") == "1"  # counted first, kept
    assert len(list(r.scan_iter("unique:*"))) == 1
    batch.commit()
    assert not r.exists(f"b-{batch.bid}-complete")


class CountsTrips:
    """A pool that counts the round trips its blocks make on their real connections."""

    def __init__(self, real: RedisPool) -> None:
        self.real = real
        self.trips = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, block: Callable[[Any], Any], **kwargs: Any) -> Any:
        def counted(conn: Any) -> Any:
            before = conn.round_trips
            try:
                return block(conn)
            finally:
                self.trips += conn.round_trips - before

        return self.real.run(counted, **kwargs)


def test_a_buffered_push_counts_all_its_batches_in_one_round_trip(
        r: redis.Redis, config: Config) -> None:
    pool = CountsTrips(RedisPool.from_config(config))
    bids: list[str] = []

    def spread(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
               call_next: Callable[[], Any]) -> None:
        payload["bid"] = bids[payload["args"][0] % 2]  # odd and even jobs, two batches
        call_next()

    client = wurk.Client(config, pool=pool, buffered=True, drain_spool=False,  # type: ignore[arg-type]
                         middleware=[spread])
    even, odd = wurk.Batch("even", client=client), wurk.Batch("odd", client=client)
    bids += [even.bid, odd.bid]
    client.push({"class": "Echo", "args": [0]})  # warm: the scripts are loaded
    pool.trips = 0
    assert len(client.push_bulk({"class": "Echo", "args": [[i] for i in range(1, 7)]})) == 6
    assert pool.trips == 2  # both batches' counts, then the write
    assert r.hget(f"b-{even.bid}", "total") == "4" and r.hget(f"b-{odd.bid}", "total") == "3"
    assert sorted(queued_args(r)) == list(range(7))


def test_a_finished_batch_refuses_the_whole_write_with_nothing_written(
        r: redis.Redis, config: Config) -> None:
    client = wurk.Client(config, buffered=False, drain_spool=False)
    live, done = wurk.Batch("live", client=client), wurk.Batch("done", client=client)
    done.commit()  # empty: it succeeds at once
    assert r.exists(f"b-{done.bid}-success")
    jobs = [(prepare.normalise({"class": "Echo", "args": [n], "bid": bid}, 0.0, "float")[0], None)
            for n, bid in ((1, live.bid), (2, done.bid))]
    with pytest.raises(batch_push.BatchError, match="already succeeded"):
        batch_push.write(prepare.as_push(jobs), (p for p, _ in jobs), client.pool)
    assert r.llen("queue:default") == 0 and r.hget(f"b-{live.bid}", "total") == "0"
    # A count that is not a number would fail mid-write: refused before anything.
    r.hset(f"b-{live.bid}", "total", "garbage")
    with pytest.raises(batch_push.BatchError, match="not a number"):
        live.push({"class": "Echo", "args": [3]})
    assert r.llen("queue:default") == 0 and r.scard(f"b-{live.bid}-jids") == 1  # the hold
    # A missing batch refuses a strict push (from wurk.Batch) the same way.
    r.delete(f"b-{live.bid}")
    with pytest.raises(batch_push.BatchError, match="does not exist"):
        live.push({"class": "Echo", "args": [3]})
    assert r.llen("queue:default") == 0


def test_the_async_client_writes_the_job_and_its_count_together(
        proxy: FaultProxy, r: redis.Redis, config: Config) -> None:
    batch = wurk.Batch("async", client=wurk.Client(config, buffered=False, drain_spool=False))

    async def main() -> None:
        async with wurk.AsyncClient(settings(proxy.url), buffered=False,
                                    drain_spool=False) as client:
            await client.push({"class": "Echo", "args": ["warm"], "bid": batch.bid})
            proxy.drop_next_reply()
            with pytest.raises(rx.ConnectionError):
                await client.push({"class": "Echo", "args": ["maybe"], "bid": batch.bid})

    asyncio.run(main())
    assert queued_args(r) == ["maybe", "warm"]
    assert r.hget(f"b-{batch.bid}", "total") == "2"


class AsyncWatched(Watched):
    """:class:`Watched` for an asyncio connection."""

    async def call(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.sent.append(args[:2])
        return await self.conn.call(*args, **kwargs)

    async def script(self, script: Any, keys: list[str], args: list[Any]) -> Any:  # type: ignore[override]
        self.sent.append(("EVALSHA", script.sha))
        return await self.conn.script(script, keys, args)

    async def pipeline(self, commands: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.sent.extend(tuple(command[:2]) for command in commands)
        return await self.conn.pipeline(commands, **kwargs)


class AsyncLosesReply:
    """:class:`LosesReply` for the asyncio pool."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def run(self, block: Callable[[Any], Any], *, idempotent: bool = False,
                  attempts: int | None = None) -> Any:
        async def watched(conn: Any) -> Any:
            seen = AsyncWatched(conn)
            result = await block(seen)
            if self.armed and (seen.wrote_jobs or not idempotent):
                self.armed = False
                raise rx.ConnectionError("the reply was lost")
            return result

        return await self.real.run(watched, idempotent=idempotent, attempts=attempts)

    async def pipeline(self, commands: Any, *, idempotent: bool = False,
                       attempts: int | None = None) -> list[Any]:
        return await self.run(lambda c: c.pipeline(commands), idempotent=idempotent,
                              attempts=attempts)


@pytest.mark.parametrize("buffered", [True, False])
def test_the_async_client_keeps_lock_and_count_when_the_outcome_is_unknown(
        r: redis.Redis, config: Config, buffered: bool) -> None:
    batch = wurk.Batch("async unknown", client=wurk.Client(config, buffered=False,
                                                           drain_spool=False))

    async def main() -> None:
        pool = AsyncLosesReply(AsyncRedisPool.from_config(config))
        async with wurk.AsyncClient(config, pool=pool, buffered=buffered,  # type: ignore[arg-type]
                                    drain_spool=False) as client:
            pool.armed = True
            # Buffered, the batch is counted first and the job written plainly.
            lost = wurk.PushOutcomeUnknown if buffered else rx.ConnectionError
            with pytest.raises(lost):
                await client.push({"class": "Echo", "args": ["landed"], "bid": batch.bid,
                                   "unique_for": 60})

    asyncio.run(main())
    assert queued_args(r) == ["landed"]
    assert r.hget(f"b-{batch.bid}", "total") == "1"
    assert len(list(r.scan_iter("unique:*"))) == 1


def test_an_operator_forgets_a_job_counted_but_never_written(
        r: redis.Redis, config: Config, cli: Cli, define: Define,
        launch: Callable[..., Any]) -> None:
    done = define(lambda status: r.rpush("fired", status["bid"]))
    client = wurk.Client(config, buffered=True, drain_spool=False)
    batch = wurk.Batch("dropped", on_success=done, client=client)
    batch.push({"class": "Echo", "args": ["gone"], "jid": "gone00000000000000000001"})
    r.delete("queue:default")  # as if its write had been dropped after the count
    batch.commit()
    assert BatchStatus.read(batch.bid, config=config).pending_jids == [
        "gone00000000000000000001"]
    assert cli("batches", "forget", batch.bid, "gone00000000000000000001").code == 2  # --yes
    assert cli("batches", "forget", batch.bid, batch._hold or "hold:x", "--yes").code == 2
    shown = cli("batches", "forget", batch.bid, "gone00000000000000000001", "--yes", "--json")
    assert shown.code == 0 and shown.json == {"bid": batch.bid, "forgotten": 1}
    launch()
    wait_for(lambda: r.llen("fired") == 1, what="the success callback")
    assert r.lrange("fired", 0, -1) == [batch.bid]

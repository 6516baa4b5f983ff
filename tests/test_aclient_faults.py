"""The asyncio client under faults: Redis down, lost replies, slow replies,
AUTH/TLS dials, replicas that do not confirm, cancellation, and exit with
pushes still buffered. Real redis-servers, the fault proxy, a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

import wurk
from tests.conftest import RedisServer, free_port, start_redis
from tests.faultproxy import FaultProxy
from tests.test_confirmed_push import FAST_SYNC, Pair, pair  # noqa: F401 - the fixture
from tests.waiting import wait_for
from wurk.push import spool
from wurk.push.spool_drain import drain_once
from wurk.redis.apool import AsyncConn, AsyncRedisPool
from wurk.redis.policy import ConnectError, PoolExhausted
from wurk.redis.pool import RetrySettings
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config

# These tests push to a Redis that never answered on purpose (its buffering is
# what they test); tests/test_push_nowhere.py covers the warning that says so.
pytestmark = pytest.mark.filterwarnings("ignore::wurk.PushSpooledWarning")

REPO = Path(__file__).resolve().parent.parent
# A blocking client would stall the loop this long; the probe allows a
# fraction (hundreds of times an idle loop's 5 ms, for a loaded machine).
HOLD = 5.0
MAX_LAG = 2.0


def settings(url: str, **extra: Any) -> Config:
    extra.setdefault("redis_retry_attempts", 1)
    return Config(redis_url=url, redis_connect_timeout=0.3, redis_retry_base=0.01,
                  log_level="warning", **extra)


def queued(server: RedisServer | redis.Redis, queue: str = "default") -> list[Any]:
    """First arguments of the queued jobs, oldest first."""
    if not isinstance(server, redis.Redis):
        with server.client() as c:
            return queued(c, queue)
    return [json.loads(raw)["args"][0] for raw in reversed(server.lrange(f"queue:{queue}", 0, -1))]


class LagProbe:
    """Ticks every few milliseconds on the loop; records the longest gap between ticks."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.ticks = 0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.worst, last = max(self.worst, now - last), now
            self.ticks += 1


def test_pushes_wait_in_the_buffer_while_redis_is_down_and_arrive_once(
        own_redis: RedisServer) -> None:
    async def main() -> tuple[list[str | None], list[Any]]:
        async with wurk.AsyncClient(settings(own_redis.url)) as client:
            await client.push({"class": "Echo", "args": [0]})  # a connection that goes stale
            own_redis.stop()
            during = [await client.push({"class": "Echo", "args": [i]}) for i in range(1, 41)]
            during += await client.push_bulk({"class": "Echo",
                                              "args": [[i] for i in range(41, 51)]})
            assert client.buffer is not None and len(client.buffer) == 50
            restarted = await asyncio.to_thread(start_redis, port=own_redis.port)
            try:
                assert await client.buffer.flush(10)
                with restarted.client() as c:
                    jids = [json.loads(raw)["jid"] for raw in reversed(c.lrange(
                        "queue:default", 0, -1))]
                return during, [jids, queued(restarted)]
            finally:
                restarted.stop()

    during, (jids, args) = asyncio.run(main())
    # The restarted server kept nothing: exactly the buffered pushes, once, in order.
    assert jids == during and args == list(range(1, 51))


def test_a_full_buffer_refuses_the_push(own_redis: RedisServer) -> None:
    own_redis.stop()

    async def main() -> None:
        client = wurk.AsyncClient(settings(own_redis.url, push_buffer_size=3,
                                           push_flush_timeout=0.1))
        for i in range(3):
            await client.push({"class": "Echo", "args": [i]})
        with pytest.raises(wurk.PushBufferFullError, match="push_buffer_size=3"):
            await client.push({"class": "Echo", "args": [99]})
        assert client.buffer is not None and len(client.buffer) == 3
        await client.aclose()  # spools the three

    asyncio.run(main())
    [name] = spool.spool_files(spool.spool_dir(settings(own_redis.url)))
    assert name.state == "waiting"


@pytest.mark.parametrize("buffered", [True, False])
def test_an_immediate_push_whose_reply_was_lost_lands_once_and_is_never_buffered(
        proxy: FaultProxy, r: redis.Redis, buffered: bool) -> None:
    async def main() -> None:
        async with wurk.AsyncClient(settings(proxy.url, redis_retry_attempts=3),
                                    buffered=buffered) as client:
            await client.push({"class": "Echo", "args": ["warm"]})
            proxy.drop_next_reply()
            if buffered:
                # One try, so an outage is seen at once: the caller is told.
                with pytest.raises(wurk.PushOutcomeUnknown):
                    await client.push({"class": "Echo", "args": ["maybe"]})
            else:
                # Replayed with the lost try's mark: a no-op where it landed.
                assert await client.push({"class": "Echo", "args": ["maybe"]}) is not None
            assert client.buffer is None or len(client.buffer) == 0
            # A scheduled push is a ZADD of one exact member: replayed, still once.
            proxy.drop_next_reply()
            assert await client.push({"class": "Echo", "args": ["later"],
                                      "at": time.time() + 100}) is not None

    asyncio.run(main())
    assert sorted(queued(r)) == ["maybe", "warm"]  # it landed once, and only once
    assert r.zcard("schedule") == 1


def test_the_loop_keeps_ticking_while_pushes_wait_on_redis(proxy: FaultProxy,
                                                           own_redis: RedisServer) -> None:
    probe = LagProbe()

    async def main() -> list[str | None]:
        ticking = asyncio.create_task(probe.run())
        slow = wurk.AsyncClient(settings(proxy.url, redis_read_timeout=HOLD + 3))
        down = wurk.AsyncClient(settings(own_redis.url, push_flush_timeout=0.1))
        await slow.push({"class": "Echo", "args": ["warm"]})
        own_redis.stop()
        proxy.delay(HOLD)  # every reply held: the pushes wait on the network
        jids = await asyncio.gather(*(slow.push({"class": "Echo", "args": [i]})
                                      for i in range(20)))
        proxy.heal()
        # Redis down: pushes go to the buffer and the drainer keeps retrying.
        jids += [await down.push({"class": "Echo", "args": [i]}) for i in range(20)]
        await asyncio.sleep(HOLD)
        assert down.buffer is not None and len(down.buffer) == 20
        ticking.cancel()
        await slow.aclose()
        await down.aclose()
        return jids

    started = time.monotonic()
    jids = asyncio.run(main())
    assert time.monotonic() - started >= 2 * HOLD and None not in jids
    assert probe.worst < MAX_LAG, f"the loop stalled for {probe.worst:.3f}s"
    assert probe.ticks > 2 * HOLD / 0.05


def test_a_cancelled_push_leaves_no_stale_reply_behind(proxy: FaultProxy,
                                                       r: redis.Redis) -> None:
    async def main() -> str | None:
        async with wurk.AsyncClient(settings(proxy.url, redis_pool_size=1)) as client:
            await client.push({"class": "Echo", "args": ["warm"]})
            proxy.delay(0.5)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.push({"class": "Echo", "args": ["cut"]}), 0.1)
            proxy.heal()
            # The one connection was closed, not handed on with "cut"'s reply unread.
            return await client.push({"class": "Echo", "args": ["next"], "at": 9e10})

    jid = asyncio.run(main())
    [(member, _)] = r.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(member)["jid"] == jid
    # The held "cut" reaches Redis: it was sent before the cancel.
    wait_for(lambda: queued(r) == ["warm", "cut"], 10, what="the held push landed")
    assert queued(r) == ["warm", "cut"]


def test_an_acl_user_pushes_and_a_wrong_password_fails_at_once(
        own_redis: RedisServer) -> None:
    with own_redis.client() as c:
        c.acl_setuser("pusher", enabled=True, passwords=["+s3cret"], keys=["*"],
                      commands=["+@all"], channels=["*"])
    port = own_redis.port

    async def main() -> None:
        async with wurk.AsyncClient(settings(f"redis://pusher:s3cret@127.0.0.1:{port}/0")) as ok:
            assert await ok.push({"class": "Echo", "args": ["acl"]}) is not None
        async with wurk.AsyncClient(settings(f"redis://pusher:wrong@127.0.0.1:{port}/0")) as bad:
            with pytest.raises(redis.AuthenticationError):
                await bad.push({"class": "Echo", "args": ["no"]})
            assert bad.buffer is not None and len(bad.buffer) == 0  # waiting cannot fix it

    asyncio.run(main())
    assert queued(own_redis) == ["acl"]


def test_a_tls_dial_to_a_plain_port_fails_as_a_dial(redis_server: RedisServer,
                                                    r: redis.Redis) -> None:
    url = f"rediss://127.0.0.1:{redis_server.port}/0"

    async def main() -> None:
        async with wurk.AsyncClient(settings(url), buffered=False) as plain:
            with pytest.raises(ConnectError):
                await plain.push({"class": "Echo", "args": [1]})
        buffered = wurk.AsyncClient(settings(url, push_flush_timeout=0.1))
        await buffered.push({"class": "Echo", "args": [2]})  # nothing reached Redis: kept
        assert buffered.buffer is not None and len(buffered.buffer) == 1
        await buffered.aclose()

    asyncio.run(main())
    assert r.llen("queue:default") == 0


def test_a_confirmed_push_waits_for_the_replica_and_a_retry_never_doubles(
        pair: Pair) -> None:  # noqa: F811 - the imported fixture
    config = settings(pair.primary.url, push_replicas=1, push_replicas_timeout=0.3,
                      reliable_push=False)

    async def main() -> None:
        async with wurk.AsyncClient(config) as client:
            await client.push({"class": "Echo", "args": [1]})
            await client.push_bulk({"class": "Echo", "args": [[2], [3]]})
            assert queued(pair.replica) == [1, 2, 3]  # WAIT already waited
            pair.detach()
            with pytest.raises(wurk.PushNotConfirmedError) as caught:
                await client.push({"class": "Echo", "args": [4]})
            await asyncio.to_thread(pair.attach)
            await caught.value.retry()

    asyncio.run(main())
    assert queued(pair.primary) == [1, 2, 3, 4]


def test_aclose_spools_what_redis_never_took_and_a_drainer_pushes_it_once(
        own_redis: RedisServer) -> None:
    config = settings(own_redis.url, push_flush_timeout=0.2)
    own_redis.stop()

    async def main() -> list[str | None]:
        # No spool drainer of its own: the test drains the spool itself.
        async with wurk.AsyncClient(config, drain_spool=False) as client:
            return [await client.push({"class": "Echo", "args": [i]}) for i in range(5)]

    with capture_logs() as logs:
        jids = asyncio.run(main())
    assert next(e for e in logs if e["event"] == "push.spooled")["jids"] == jids
    restarted = start_redis(port=own_redis.port)
    try:
        assert len(drain_once(config, runtime_for(config).pool).pushed) == 1
        assert queued(restarted) == list(range(5))
    finally:
        restarted.stop()


LEFT_AT_EXIT = """
import asyncio, sys, warnings, wurk
warnings.simplefilter("ignore", wurk.PushSpooledWarning)  # -W error for the rest
wurk.configure(wurk.Config(redis_url=sys.argv[1], redis_connect_timeout=0.2,
                           log_level="error"))
@wurk.job
def echo(x): pass
async def main():
    print(await echo.aperform_async(1), await echo.aperform_bulk([[2], [3]]), flush=True)
asyncio.run(main())  # no aclose: the loop ends, the drainer is cancelled
"""


def test_a_loop_that_ends_without_aclose_spools_its_buffer_at_exit() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    done = subprocess.run([sys.executable, "-W", "error", "-c", LEFT_AT_EXIT, url], cwd=REPO,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed" not in done.stderr and "never awaited" not in done.stderr
    [name] = spool.spool_files(spool.spool_dir(Config(redis_url=url)))
    with name.path.open("rb") as fh:
        entries = list(spool.read_entries(fh, spool.read_header(fh)))
    assert len(entries) == 3 and entries[0].jid in done.stdout


def test_a_checkout_that_starves_raises_pool_exhausted_and_the_buffer_keeps_the_push(
        redis_server: RedisServer, r: redis.Redis) -> None:
    pool = AsyncRedisPool(redis_server.url, size=1, retry=RetrySettings(checkout_timeout=0.1))

    async def hold(conn: AsyncConn) -> None:
        await conn.call("PING")
        await asyncio.sleep(0.5)

    async def main() -> int:
        client = wurk.AsyncClient(settings(redis_server.url), pool=pool)
        holder = asyncio.create_task(pool.run(hold))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolExhausted):
            await pool.call("PING")
        await client.push({"class": "Echo", "args": ["starved"]})  # nothing sent: kept
        assert client.buffer is not None
        waiting = len(client.buffer)
        await holder
        assert await client.buffer.flush(5)
        await client.aclose()
        return waiting

    assert asyncio.run(main()) == 1
    assert queued(r) == ["starved"]


def test_the_loop_keeps_ticking_while_a_dial_hangs(r: redis.Redis) -> None:
    """A listener whose accept queue is full drops every new SYN: each dial
    hangs until the connect timeout, as with a host that went dark."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):  # fill the accept queue; these are never accepted
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    probe = LagProbe()

    async def main() -> tuple[int, float]:
        ticking = asyncio.create_task(probe.run())
        client = wurk.AsyncClient(Config(redis_url=f"redis://127.0.0.1:{port}/0",
                                         redis_connect_timeout=HOLD, redis_retry_attempts=1,
                                         push_flush_timeout=0.1, log_level="warning"))
        started = time.monotonic()
        await asyncio.gather(*(client.push({"class": "Echo", "args": [i]}) for i in range(10)))
        waited = time.monotonic() - started
        assert client.buffer is not None
        kept = len(client.buffer)
        await client.aclose()  # spools them
        ticking.cancel()
        return kept, waited

    try:
        kept, waited = asyncio.run(main())
    finally:
        for sock in (*fillers, listener):
            sock.close()
    # The dials did hang, and were given up.
    assert kept == 10 and waited >= HOLD * 0.8, f"kept {kept}, waited {waited:.3f}s"
    assert probe.worst < MAX_LAG, f"the loop stalled for {probe.worst:.3f}s"

"""A concurrent limiter's release that Redis refused is kept and sent again
(wurk.wire.kept_writes): the slot comes free as soon as Redis takes writes
again, long before its lease would have freed it. The sync and the asyncio
release alike; the fault is a real cut between the process and a real Redis
(tests/faultproxy.py), as for the unique-lock releases of
tests/test_unique_release.py."""

from __future__ import annotations

import asyncio

import pytest
import redis
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from waiting import wait_for

import wurk
from wurk.limiter import awaiting
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(90)
LEASE = 3600  # the slot's own end: far beyond any wait below


def cut_off(proxy: FaultProxy) -> None:
    proxy.refuse(10**9)  # every new dial is reset (the listener stays: no port to lose)
    proxy.half_close()  # and every open socket sees the cut


def through(proxy: FaultProxy) -> Config:
    return Config(redis_url=proxy.url, redis_retry_base=0.05, redis_retry_cap=0.2,
                  log_level="warning")


def refused(logs: list[dict[str, object]]) -> bool:
    return any(e["event"] == "limiter.release_failed" for e in logs)


def test_a_release_refused_while_cut_off_frees_the_slot_once_redis_answers(
        r: redis.Redis, proxy: FaultProxy) -> None:
    config = through(proxy)
    limiter = wurk.limiter.concurrent("kept-db", 1, lease=LEASE, wait_timeout=0, config=config)
    try:
        with capture_logs() as logs:
            with limiter.acquire():
                assert r.zcard("lmtr-cs:kept-db") == 1
                cut_off(proxy)
            assert refused(logs)  # the block's own outcome stands: nothing was raised
        assert r.zcard("lmtr-cs:kept-db") == 1  # still held: Redis never heard of the release
        proxy.heal()
        wait_for(lambda: r.zcard("lmtr-cs:kept-db") == 0, timeout=30,
                 what="the slot freed after the heal, not after its lease")
        assert limiter.try_acquire() is not None
        assert r.hget("lmtr-stats:kept-db", "overages") in (None, "0")
    finally:
        close_runtime(config)


def test_an_async_release_refused_while_cut_off_frees_the_slot_once_redis_answers(
        r: redis.Redis, proxy: FaultProxy) -> None:
    config = through(proxy)
    limiter = wurk.limiter.concurrent("kept-async", 1, lease=LEASE, wait_timeout=0,
                                      config=config)

    async def hold_and_release() -> None:
        async with limiter.acquire():
            assert r.zcard("lmtr-cs:kept-async") == 1
            cut_off(proxy)
        await awaiting.aclose()

    try:
        with capture_logs() as logs:
            asyncio.run(hold_and_release())
            assert refused(logs)
        assert r.zcard("lmtr-cs:kept-async") == 1
        proxy.heal()
        wait_for(lambda: r.zcard("lmtr-cs:kept-async") == 0, timeout=30,
                 what="the slot freed after the heal, not after its lease")
    finally:
        close_runtime(config)

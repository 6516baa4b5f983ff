"""Limiters in async code: ``async with limiter.acquire()`` waits without holding the loop,
and a plain ``with`` on an event loop checks once instead of sleeping on it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

import wurk
from wurk.limiter import OverLimit, Permit, awaiting
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)


def test_async_acquire_admits_and_releases_a_concurrent_slot(config: Config,
                                                             r: redis.Redis) -> None:
    limiter = wurk.limiter.concurrent("a-db", 1, lease=60, wait_timeout=0)

    async def use() -> None:
        async with limiter.acquire() as permit:
            assert isinstance(permit, Permit)
            assert r.zcard("lmtr-cs:a-db") == 1
            with pytest.raises(OverLimit):
                async with limiter.acquire():
                    pass
        assert r.zcard("lmtr-cs:a-db") == 0
        await awaiting.aclose()

    asyncio.run(use())


def test_a_refused_async_acquire_leaves_the_loop_to_other_tasks(config: Config) -> None:
    held = wurk.limiter.concurrent("a-held", 1, lease=60)
    assert held.try_acquire() is not None  # taken for the whole test: only a timeout ends a wait

    async def main() -> tuple[int, bool]:
        waiter = asyncio.create_task(_acquire(held.acquire(wait_timeout=30)))
        ticks = 0
        for _ in range(20):  # a ticker that a blocking wait would hold back for 30 s
            await asyncio.sleep(0.01)
            ticks += 1
        still_waiting = not waiter.done()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await awaiting.aclose()
        return ticks, still_waiting

    ticks, still_waiting = asyncio.run(main())
    assert ticks == 20 and still_waiting


def test_a_window_waits_by_awaiting_then_admits(config: Config) -> None:
    limiter = wurk.limiter.window("a-window", 1, interval=0.3, wait_timeout=10)

    async def main() -> list[Any]:
        first = await _acquire(limiter.acquire())
        second = await _acquire(limiter.acquire())  # refused once, then room after the window
        await awaiting.aclose()
        return [first, second]

    assert all(isinstance(p, Permit) for p in asyncio.run(main()))


def test_a_plain_with_on_an_event_loop_checks_once_and_never_sleeps(config: Config) -> None:
    held = wurk.limiter.concurrent("a-sync", 1, lease=60)
    assert held.try_acquire() is not None

    async def job() -> None:
        with held.acquire(wait_timeout=30):  # before: a 30 s sleep that stalled the loop
            pass

    with capture_logs() as logs, pytest.raises(OverLimit):
        asyncio.run(job())
    assert [e["event"] for e in logs] == ["limiter.blocking_on_loop"]
    assert "async with" in logs[0]["hint"]


async def _acquire(acquisition: Any) -> Permit:
    async with acquisition as permit:
        return permit  # type: ignore[no-any-return]

"""A RedisPool with its sleeps, jitter and error hook injected, for the pool's unit tests.

1. ``make_pool`` (a fixture) builds pools on ``NOWHERE`` (or a given url) with
   a seeded rng, sleeps recorded in ``sleeps`` and every error report in
   ``rec``; it closes them afterwards.
2. ``NOWHERE`` is a url nothing listens on: a ``Conn`` never dials unless a
   block sends something.

A test module takes the fixtures by assigning them (``make_pool = pools.make_pool``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from recording import Recorder

from wurk.redis.pool import RedisPool, RetrySettings

# Conn never dials unless a block sends something: nothing listens here.
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make_pool(rec: Recorder, sleeps: list[float]) -> Iterator[Callable[..., RedisPool]]:
    pools: list[RedisPool] = []

    def make(**kwargs: Any) -> RedisPool:
        kwargs.setdefault("retry", RetrySettings(max_attempts=4, base=0.5, cap=4.0,
                                                 checkout_timeout=0.2))
        kwargs.setdefault("sleep", sleeps.append)
        kwargs.setdefault("rng", random.Random(0))
        pool = RedisPool(kwargs.pop("url", NOWHERE), on_error=rec, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()

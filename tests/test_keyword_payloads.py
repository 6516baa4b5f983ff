"""Keyword payloads: what a job receives is what was pushed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from tuning import tuned

import wurk
from wurk import registry
from wurk.push.job import JobFunction
from wurk.settings.config import Config
from wurk.wire import keywords
from wurk.wire.payload import loads_job

Define = Callable[..., JobFunction[..., Any]]
QUEUE = "kwq"


def queued(rb: redis.Redis) -> list[dict[str, Any]]:
    return [loads_job(raw) for raw in reversed(rb.lrange(f"queue:{QUEUE}", 0, -1))]


@pytest.fixture
def kw_config(config: Config) -> Config:
    return tuned(config, queues=[QUEUE], concurrency=4, log_level="critical")


# -- the verbs' own first parameter -------------------------------------------------------------
def test_a_keyword_named_self_or_cls_reaches_the_job(
        kw_config: Config, define: Define, rb: redis.Redis) -> None:
    # The verbs' self and cls are positional-only, as their seconds and when are,
    # so a job's parameter of that name is taken by keyword like any other.
    def named(*, self: str, cls: str = "") -> str:
        return self + cls

    job = define(named, queue=QUEUE)

    class Named(wurk.Job, name=f"t_named_{uuid.uuid4().hex[:10]}", queue=QUEUE):
        def perform(self, *, cls: str) -> None:
            pass

    try:
        assert job(self="a", cls="b") == "ab"
        job.perform_async(self="a")
        job.perform_bulk([job.args(self="b", cls="c")])
        Named.perform_async(cls="d")
        Named.perform_bulk([Named.args(cls="e")])
        [(_, first), (_, second), (_, third), (_, fourth)] = [
            keywords.split(p) for p in queued(rb)]
        assert [first, second, third, fourth] == [
            {"self": "a"}, {"self": "b", "cls": "c"}, {"cls": "d"}, {"cls": "e"}]
    finally:
        registry.discard(Named.wurk_name)

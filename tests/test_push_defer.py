"""A client middleware that defers a push (``wurk.push.middleware.defer``), and
``when_configured``, the hook integrations use to reach every worker's config."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

import wurk
from wurk.push import middleware
from wurk.settings import config as settings_config
from wurk.settings.config import Config


class Deferring:
    """Keeps pushes until ``release``; lets through the ones it resumes."""

    def __init__(self) -> None:
        self.later: list[Callable[[], object]] = []
        self.releasing = False

    def __call__(self, job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], Any]) -> None:
        if self.releasing:
            call_next()
            return
        self.later.append(middleware.defer())

    def release(self) -> None:
        self.releasing = True
        for push in self.later:
            push()


def queued(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in r.lrange(f"queue:{queue}", 0, -1)]


def test_a_deferred_push_returns_its_jid_and_writes_that_job_later(
        config: Config, r: redis.Redis) -> None:
    deferring = Deferring()
    client = wurk.Client(config, middleware=[deferring])
    jid = client.push({"class": "Later", "args": [1], "retry": 3})
    assert isinstance(jid, str) and len(jid) == 24
    assert queued(r) == []
    deferring.release()
    [job] = queued(r)
    assert job["jid"] == jid and job["args"] == [1] and job["retry"] == 3


def test_a_deferred_bulk_push_returns_every_jid_in_order(config: Config, r: redis.Redis) -> None:
    deferring = Deferring()
    client = wurk.Client(config, middleware=[deferring])
    jids = client.push_bulk({"class": "Later", "args": [[1], [2], [3]]})
    assert len(jids) == 3 and queued(r) == []
    deferring.release()
    assert sorted(j["jid"] for j in queued(r)) == sorted(jids)


def test_a_stopped_push_still_returns_none(config: Config, r: redis.Redis) -> None:
    def stop(*_: Any) -> None:
        return None

    assert wurk.Client(config, middleware=[stop]).push({"class": "Never", "args": []}) is None
    assert queued(r) == []


def test_defer_outside_a_push_is_refused() -> None:
    with pytest.raises(RuntimeError, match="during a push"):
        middleware.defer()


def test_a_middleware_that_defers_and_calls_next_writes_once(config: Config,
                                                            r: redis.Redis) -> None:
    def both(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
             call_next: Callable[[], Any]) -> None:
        middleware.defer()
        call_next()

    jid = wurk.Client(config, middleware=[both]).push({"class": "Now", "args": []})
    assert [j["jid"] for j in queued(r)] == [jid]


def test_when_configured_reaches_the_current_default_and_every_later_one(
        monkeypatch: pytest.MonkeyPatch, config: Config, redis_server: Any) -> None:
    monkeypatch.setattr(settings_config, "_on_configured", [])
    seen: list[Config] = []
    settings_config.when_configured(seen.append)
    assert seen == [config]
    later = Config(redis_url=redis_server.url)
    wurk.configure(later)
    assert seen == [config, later]


def test_a_when_configured_callback_may_install_a_changed_copy(
        monkeypatch: pytest.MonkeyPatch, config: Config, redis_server: Any) -> None:
    """Config is frozen: an integration that sets a single hook (Django's
    ``on_redis_error``) returns a copy, and that copy is the default installed."""
    monkeypatch.setattr(settings_config, "_on_configured", [])

    def on_redis_error(*args: Any, **kwargs: Any) -> None:
        pass

    def add_hook(given: Config) -> Config | None:
        if given.on_redis_error is not None:
            return None
        return dataclasses.replace(given, on_redis_error=on_redis_error)

    settings_config.when_configured(add_hook)
    now = wurk.default_config()
    assert (now.on_redis_error, now.redis_url) == (on_redis_error, config.redis_url)
    later = Config(redis_url=redis_server.url, concurrency=3)
    installed = wurk.configure(later)
    assert installed is wurk.default_config()
    assert (installed.on_redis_error, installed.concurrency) == (on_redis_error, 3)

"""wurk.contrib.flask: the extension, its settings, pushes from views (examples/flask_app.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer
from waiting import wait_for

pytest.importorskip("flask")

import wurk
from examples import flask_app
from examples.jobs import WELCOMED
from wurk.contrib.flask import Wurk
from wurk.redis.runtime import close_runtime
from wurk.settings import config as settings_config
from wurk.settings.config import ConfigError


@pytest.fixture
def apps(redis_server: RedisServer, r: redis.Redis,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    # init_app installs the app's config as the default: give the old one back after.
    monkeypatch.setattr(settings_config, "_default", settings_config._default)
    made: list[Any] = []
    yield made
    for app in made:
        close_runtime(app.extensions["wurk"].config)
    wurk.Client._default = None


def make(apps: list[Any], redis_server: RedisServer, **settings: Any) -> Any:
    app = flask_app.create_app({"WURK_REDIS_URL": redis_server.url, **settings})
    apps.append(app)
    return app


def queued(r: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in r.lrange(f"queue:{queue}", 0, -1)]


def test_a_view_pushes_with_the_apps_settings(apps: list[Any], redis_server: RedisServer,
                                              r: redis.Redis) -> None:
    app = make(apps, redis_server)
    reply = app.test_client().post("/signup/7")
    assert reply.status_code == 200
    [job] = queued(r, "default")
    assert job["jid"] == reply.get_json()["enqueued"] and job["args"] == [7, "user7@example.com"]
    assert wurk.default_config() is app.extensions["wurk"].config


def test_a_view_pushes_through_the_apps_own_client(apps: list[Any], redis_server: RedisServer,
                                                   r: redis.Redis) -> None:
    app = make(apps, redis_server)
    reply = app.test_client().post("/orders/o-1/charge")
    [job] = queued(r, "critical")
    assert job["jid"] == reply.get_json()["enqueued"] and job["args"] == ["o-1", 1999]


def test_settings_layer_the_dict_under_the_prefixed_keys(apps: list[Any],
                                                        redis_server: RedisServer) -> None:
    app = make(apps, redis_server, WURK={"concurrency": 3, "queues": ["a"]}, WURK_QUEUES=["b"])
    config = app.extensions["wurk"].config
    assert config.concurrency == 3 and config.queues == ["b"]
    assert config.redis_url == redis_server.url


@pytest.mark.parametrize(("settings", "message"), [
    ({"WURK_CONCURRENCY": 0}, "app.config['WURK_CONCURRENCY']: concurrency must be"),
    ({"WURK": {"concurrency": "many"}}, "app.config['WURK']: concurrency must be int"),
    ({"WURK_CONCURENCY": 2}, "app.config: unknown key 'WURK_CONCURENCY'"),
    ({"WURK": ["redis_url"]}, "app.config: WURK must be a dict of wurk settings"),
])
def test_a_bad_setting_is_named_with_its_key(apps: list[Any], redis_server: RedisServer,
                                             settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        flask_app.create_app({"WURK_REDIS_URL": redis_server.url, **settings})
    assert message in str(caught.value)


def test_one_extension_serves_several_apps_of_a_factory(apps: list[Any],
                                                       redis_server: RedisServer) -> None:
    first = make(apps, redis_server, WURK_TAG="first")
    second = make(apps, redis_server, WURK_TAG="second")
    with first.app_context():
        assert flask_app.wurk_ext.config.tag == "first"
        assert flask_app.wurk_ext.client.config.tag == "first"
    with second.app_context():
        assert flask_app.wurk_ext.config.tag == "second"


def test_outside_an_initialised_app_the_extension_says_what_is_missing() -> None:
    from flask import Flask

    with Flask("bare").app_context(), pytest.raises(RuntimeError, match="init_app"):
        _ = Wurk().config


def test_an_embedded_worker_runs_what_a_view_pushed(apps: list[Any], redis_server: RedisServer,
                                                   r: redis.Redis) -> None:
    app = make(apps, redis_server, WURK={"heartbeat_interval": 0.2, "fetch_timeout": 0.2,
                                         "shutdown_timeout": 2.0, "log_level": "warning"})
    # As docs/how-to/flask.md calls it: in the factory, outside any app context.
    embedded = flask_app.wurk_ext.start_embedded()
    assert embedded.config is app.extensions["wurk"].config
    try:
        app.test_client().post("/signup/11")
        wait_for(lambda: r.sismember(WELCOMED, "11"), what="the welcome job ran")
    finally:
        embedded.stop()

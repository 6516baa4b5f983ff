"""Config: defaults < TOML ``[wurk]`` < environment < keyword overrides, and errors
that name the source, the key and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wurk
from wurk.config import DEFAULT_REDIS_URL, Config, ConfigError


@pytest.fixture(autouse=True)
def _no_real_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)


def write_toml(tmp_path: Path, text: str, name: str = "wurk.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as err:
        Config.load(*args, **kwargs)
    return str(err.value)


# -- defaults and sources ---------------------------------------------------------


def test_defaults() -> None:
    for config in (Config.load(env={}), Config()):
        assert config.redis_url == DEFAULT_REDIS_URL
        assert config.concurrency == 10
        assert config.queues == ["default"]
        assert config.require == []
        assert config.shutdown_timeout == 25.0
        assert config.timestamps == "float"
        assert config.max_retries == 25
        assert config.dead_max_jobs == 10_000
        assert config.dead_timeout == 180 * 24 * 3600.0
        assert config.average_scheduled_poll_interval == 5.0
        assert config.poll_interval_average is None
        assert config.fetch_timeout == 2.0
        assert config.redis_pool_size is None
        assert config.pool_size == 15
        assert config.log_level == "info"
        assert config.error_handlers == []


def test_default_lists_are_not_shared() -> None:
    a, b = Config.load(env={}), Config.load(env={})
    a.queues.append("x")
    a.require.append("m")
    assert b.queues == ["default"]
    assert b.require == []
    assert Config().queues == ["default"]


def test_load_from_toml_wurk_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, """
[other]
concurrency = "ignored: not our table"

[wurk]
redis_url = "redis://cache.internal:6380/2"
concurrency = 4
queues = ["critical:3", "default"]
require = ["app.jobs"]
shutdown_timeout = 8
timestamps = "ms"
redis_pool_size = 12
poll_interval_average = 0.5
""")
    config = Config.load(path, env={})
    assert config.redis_url == "redis://cache.internal:6380/2"
    assert config.concurrency == 4
    assert config.queues == ["critical:3", "default"]
    assert config.require == ["app.jobs"]
    assert config.shutdown_timeout == 8
    assert config.timestamps == "ms"
    assert config.pool_size == 12
    assert config.poll_interval_average == 0.5
    # Untouched settings keep their defaults.
    assert config.max_retries == 25


def test_toml_without_wurk_table_gives_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[tool.other]\nx = 1\n')
    assert Config.load(path, env={}) == Config.load(env={})


def test_env_values_are_coerced() -> None:
    config = Config.load(env={
        "REDIS_URL": "redis://envhost:6390/3",
        "WURK_CONCURRENCY": "7",
        "WURK_QUEUES": "critical:3, default ,,low",
        "WURK_SHUTDOWN_TIMEOUT": "12.5",
        "WURK_REDIS_POOL_SIZE": "30",
        "WURK_POLL_INTERVAL_AVERAGE": "0.25",
        "WURK_REQUIRE": "app.jobs,app.more",
        "WURK_TAG": "blue",
        "UNRELATED": "whatever",
    })
    assert config.redis_url == "redis://envhost:6390/3"
    assert config.concurrency == 7
    assert type(config.concurrency) is int
    assert config.queues == ["critical:3", "default", "low"]
    assert config.shutdown_timeout == 12.5
    assert config.redis_pool_size == 30
    assert config.poll_interval_average == 0.25
    assert config.require == ["app.jobs", "app.more"]
    assert config.tag == "blue"


def test_env_whole_number_for_float_field() -> None:
    config = Config.load(env={"WURK_SHUTDOWN_TIMEOUT": "30"})
    assert config.shutdown_timeout == 30


def test_empty_redis_url_env_is_ignored() -> None:
    assert Config.load(env={"REDIS_URL": ""}).redis_url == DEFAULT_REDIS_URL


def test_wurk_redis_url_env() -> None:
    config = Config.load(env={"WURK_REDIS_URL": "rediss://secure:6380/0"})
    assert config.redis_url == "rediss://secure:6380/0"


def test_load_reads_process_environment_when_env_not_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WURK_CONCURRENCY", "3")
    monkeypatch.setenv("REDIS_URL", "redis://fromenv:1/0")
    config = Config.load()
    assert config.concurrency == 3
    assert config.redis_url == "redis://fromenv:1/0"


def test_precedence_defaults_toml_env_overrides(tmp_path: Path) -> None:
    path = write_toml(tmp_path, """
[wurk]
concurrency = 5
queues = ["from_toml"]
tag = "toml"
redis_url = "redis://toml:1/0"
""")
    env = {"WURK_CONCURRENCY": "7", "WURK_TAG": "env", "REDIS_URL": "redis://env:1/0"}

    config = Config.load(path, env=env, concurrency=9)
    assert config.concurrency == 9           # override beats env
    assert config.tag == "env"               # env beats TOML
    assert config.redis_url == "redis://env:1/0"
    assert config.queues == ["from_toml"]    # TOML beats default
    assert config.max_retries == 25          # default when nobody sets it

    assert Config.load(path, env=env).concurrency == 7
    assert Config.load(path, env={}).concurrency == 5
    assert Config.load(path, env={}).redis_url == "redis://toml:1/0"
    assert Config.load(env={}).concurrency == 10
    # An override of None means "not given".
    assert Config.load(path, env=env, concurrency=None).concurrency == 7


def test_configure_installs_default(redis_server: Any) -> None:
    config = Config(redis_url=redis_server.url, concurrency=2)
    previous = wurk.default_config()
    try:
        assert wurk.configure(config) is config
        assert wurk.default_config() is config
    finally:
        wurk.configure(previous)
        config.reset_pool()


# -- errors: source + key + value ------------------------------------------------


def assert_names(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, (part, message)


def test_unknown_key_in_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[wurk]\nconcurrenc = 5\n')
    assert_names(error_of(path, env={}), str(path), "'concurrenc'", "5")


def test_unknown_override_key() -> None:
    assert_names(error_of(env={}, threads=4), "arguments", "'threads'", "4")


def test_hooks_cannot_come_from_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[wurk]\nerror_handlers = ["x"]\n')
    assert_names(error_of(path, env={}), str(path), "error_handlers")


@pytest.mark.parametrize(
    ("line", "key", "shown"),
    [
        ('concurrency = "ten"', "concurrency", "'ten'"),
        ("concurrency = true", "concurrency", "True"),
        ("concurrency = 2.5", "concurrency", "2.5"),
        ('queues = "default"', "queues", "'default'"),
        ("queues = [1, 2]", "queues", "[1, 2]"),
        ("shutdown_timeout = false", "shutdown_timeout", "False"),
        ("redis_url = 6379", "redis_url", "6379"),
        ("concurrency = 0", "concurrency", "0"),
        ("concurrency = -4", "concurrency", "-4"),
        ("queues = []", "queues", "[]"),
        ('queues = ["default", "a:x"]', "queues", "'a:x'"),
        ('queues = ["a:-2"]', "queues", "'a:-2'"),
        ('redis_url = "http://localhost:6379"', "redis_url", "'http://localhost:6379'"),
        ('timestamps = "seconds"', "timestamps", "'seconds'"),
        ("fetch_timeout = 0", "fetch_timeout", "0"),
        ("max_retries = -1", "max_retries", "-1"),
        ('log_level = "loud"', "log_level", "'loud'"),
    ],
)
def test_bad_toml_values_name_source_key_value(tmp_path: Path, line: str, key: str,
                                               shown: str) -> None:
    path = write_toml(tmp_path, f"[wurk]\n{line}\n")
    assert_names(error_of(path, env={}), str(path), key, shown)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert_names(error_of(path, env={}), str(path), "cannot read")


def test_directory_is_unreadable(tmp_path: Path) -> None:
    assert_names(error_of(tmp_path, env={}), str(tmp_path), "cannot read")


def test_invalid_toml_is_reported(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[wurk]\nconcurrency = \n")
    assert_names(error_of(path, env={}), str(path), "invalid TOML")


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[wurk]\ntag = "caf\xe9"\n'.encode("latin-1"))
    assert_names(error_of(path, env={}), str(path))


def test_wurk_must_be_a_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'wurk = "yes"\n')
    assert_names(error_of(path, env={}), str(path), "wurk", "'yes'")


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("WURK_CONCURRENCY", "abc"),
        ("WURK_CONCURRENCY", "2.5"),
        ("WURK_SHUTDOWN_TIMEOUT", "soon"),
        ("WURK_REDIS_POOL_SIZE", "many"),
    ],
)
def test_bad_env_values_are_named(var: str, raw: str) -> None:
    assert_names(error_of(env={var: raw}), "environment", var, repr(raw))


@pytest.mark.parametrize(
    ("env", "key", "shown"),
    [
        ({"WURK_CONCURRENCY": "0"}, "concurrency", "0"),
        ({"WURK_QUEUES": "a:x"}, "queues", "'a:x'"),
        ({"WURK_QUEUES": " , "}, "queues", "[]"),
        ({"REDIS_URL": "localhost:6379"}, "redis_url", "'localhost:6379'"),
        ({"WURK_TIMESTAMPS": "iso"}, "timestamps", "'iso'"),
    ],
)
def test_env_values_that_fail_validation_blame_the_environment(
        tmp_path: Path, env: dict[str, str], key: str, shown: str) -> None:
    path = write_toml(tmp_path, "[wurk]\nconcurrency = 3\n")
    for message in (error_of(env=env), error_of(path, env=env)):
        assert_names(message, "environment", key, shown)
        assert str(path) not in message


def test_bad_override_blames_arguments(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[wurk]\nconcurrency = 3\n")
    message = error_of(path, env={}, concurrency="x")
    assert_names(message, "arguments", "concurrency", "'x'")
    assert str(path) not in message


def test_toml_error_still_blames_the_file_with_env_present(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[wurk]\nconcurrency = 0\n")
    message = error_of(path, env={"WURK_TAG": "fine"})
    assert_names(message, str(path), "concurrency", "0")


@pytest.mark.parametrize(
    ("kwargs", "key", "shown"),
    [
        ({"concurrency": 0}, "concurrency", "0"),
        ({"queues": []}, "queues", "[]"),
        ({"queues": ["ok", "a:x"]}, "queues", "'a:x'"),
        ({"redis_url": "http://h"}, "redis_url", "'http://h'"),
        ({"redis_pool_size": 0}, "redis_pool_size", "0"),
    ],
)
def test_direct_construction_validates(kwargs: dict[str, Any], key: str, shown: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config(**kwargs)
    assert_names(str(err.value), "arguments", key, shown)


def test_from_mapping_uses_given_source() -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_mapping({"concurrency": "x"}, source="topology.toml: [[slot]] 0")
    assert_names(str(err.value), "topology.toml: [[slot]] 0", "concurrency", "'x'")
    ok = Config.from_mapping({"concurrency": 3}, source="x")
    assert ok.concurrency == 3


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert wurk.ConfigError is ConfigError

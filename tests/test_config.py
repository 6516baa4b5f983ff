"""Config: defaults < TOML ``[wurk]`` < environment < keyword overrides, and errors
that name the source, the key and the value."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

import wurk
from wurk.redis.runtime import close_runtime
from wurk.settings.config import DEFAULT_REDIS_URL, Config, ConfigError
from wurk.settings.declared import BY_NAME, RANGES


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
        assert config.pool_size == 16
        assert config.log_level == "info"
        assert config.error_handlers == []


def test_a_config_is_frozen_and_a_change_is_a_checked_copy() -> None:
    config = Config.load(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.concurrency = 3  # type: ignore[misc]
    changed = dataclasses.replace(config, concurrency=3)
    assert (changed.concurrency, config.concurrency) == (3, 10)
    with pytest.raises(ConfigError, match="concurrency"):
        dataclasses.replace(config, concurrency=0)


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


def test_precedence_command_line_file_wurk_env_redis_url_default(tmp_path: Path) -> None:
    """Issue #12: command line > config file > WURK_* > REDIS_URL > default."""
    path = write_toml(tmp_path, """
[wurk]
concurrency = 5
queues = ["from_toml"]
tag = "toml"
redis_url = "redis://toml:1/0"
""")
    env = {"WURK_CONCURRENCY": "7", "WURK_TAG": "env", "WURK_MAX_RETRIES": "3",
           "REDIS_URL": "redis://env:1/0"}

    config = Config.load(path, env=env, concurrency=9)
    assert config.concurrency == 9           # command line beats the file
    assert config.tag == "toml"              # the file beats WURK_*
    assert config.redis_url == "redis://toml:1/0"  # the file beats REDIS_URL
    assert config.max_retries == 3          # WURK_* beats the default
    assert config.dead_max_jobs == 10_000    # default when nobody sets it

    assert Config.load(path, env=env).concurrency == 5
    assert Config.load(env=env).concurrency == 7
    assert Config.load(env=env).redis_url == "redis://env:1/0"
    both = {**env, "WURK_REDIS_URL": "redis://wurk:1/0"}
    assert Config.load(env=both).redis_url == "redis://wurk:1/0"   # WURK_* beats REDIS_URL
    assert Config.load(env=both, redis_url="redis://flag:1/0").redis_url == "redis://flag:1/0"
    assert Config.load(env={}).redis_url == "redis://localhost:6379/0"
    # An override of None means "not given".
    assert Config.load(path, env=env, concurrency=None).concurrency == 5


@pytest.mark.parametrize(("env", "flag", "blamed"), [
    ({"REDIS_URL": "bogus://x"}, None, "environment: REDIS_URL"),
    ({"WURK_REDIS_URL": "bogus://x"}, None, "environment: WURK_REDIS_URL"),
    ({"REDIS_URL": "redis://ok:1/0"}, "bogus://x", "arguments"),
])
def test_a_bad_redis_url_is_blamed_on_its_real_source(env: dict[str, str], flag: str | None,
                                                      blamed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.load(env=env, redis_url=flag)
    assert str(caught.value).startswith(f"{blamed}: redis_url ")


@pytest.mark.parametrize("env", [{"REDIS_URL": "bogus://x"}, {"WURK_REDIS_URL": "bogus://x"}])
def test_a_good_url_from_a_higher_source_hides_a_bad_lower_one(tmp_path: Path,
                                                              env: dict[str, str]) -> None:
    path = write_toml(tmp_path, '[wurk]\nredis_url = "redis://file:1/0"\n')
    assert Config.load(path, env=env).redis_url == "redis://file:1/0"
    assert Config.load(env=env, redis_url="redis://flag:1/0").redis_url == "redis://flag:1/0"


def test_configure_installs_default(redis_server: Any) -> None:
    config = Config(redis_url=redis_server.url, concurrency=2)
    previous = wurk.default_config()
    try:
        assert wurk.configure(config) is config
        assert wurk.default_config() is config
    finally:
        wurk.configure(previous)
        close_runtime(config)


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
        # Out of range, however large: still one line naming the file.
        ("shutdown_timeout = 1e10", "shutdown_timeout", "10000000000.0"),
        ("concurrency = 10000000", "concurrency", "10000000"),
        ("redis_pool_size = 1000000000", "redis_pool_size", "1000000000"),
        ("max_retries = 1000000", "max_retries", "1000000"),
        ("dead_max_jobs = 1000000000000", "dead_max_jobs", "1000000000000"),
        ("profile_ttl = 1000000000000", "profile_ttl", "1000000000000"),
        ("heartbeat_interval = 3600", "heartbeat_interval", "3600"),
        ("fetch_timeout = 1e6", "fetch_timeout", "1000000.0"),
        ("redis_retry_base = -1", "redis_retry_base", "-1"),
        ("redis_retry_cap = 1e9", "redis_retry_cap", "1000000000.0"),
        ("push_replicas = 1000", "push_replicas", "1000"),
        ("poll_interval_average = 1e-9", "poll_interval_average", "1e-09"),
        ('queues = ["a:100000000000"]', "queues", "'a:100000000000'"),
        ('queues = ["a:1000000", "b"]', "queues", "'a:1000000'"),
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


def test_a_fifo_or_a_device_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "wurk.toml"
    os.mkfifo(fifo)
    assert_names(error_of(fifo, env={}), str(fifo), "cannot read", "not a regular file (a FIFO)")
    assert_names(error_of(Path("/dev/zero"), env={}), "/dev/zero", "a character device")


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
    # The file sets another key: one it set would win over the environment.
    path = write_toml(tmp_path, "[wurk]\ntag = \"file\"\n")
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


# -- ranges: every number has a documented lower and upper bound ------------------

NUMERIC = sorted(name for name, s in BY_NAME.items() if int in s.types or float in s.types)


def test_every_numeric_setting_has_a_range() -> None:
    assert sorted(RANGES) == NUMERIC


def test_settings_reference_shows_each_range() -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "reference" / "settings.md"
    rows = {line.split("|")[1].strip(" `"): line
            for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("| `")}
    for name, bounds in RANGES.items():
        assert f"| {bounds.describe()} |" in rows[name], name


@pytest.mark.parametrize("name", sorted(RANGES))
def test_each_range_is_enforced_at_both_ends(name: str) -> None:
    bounds = RANGES[name]
    kind = int if float not in BY_NAME[name].types else float
    for inside in (bounds.low, bounds.high):
        assert getattr(Config(**{name: kind(inside)}), name) == inside
    step = 1 if kind is int else bounds.low / 2 or 0.5
    for outside in (bounds.low - step, bounds.high + step * 10):
        message = error_of(env={}, **{name: kind(outside)})
        assert_names(message, "arguments", name, f"from {bounds.describe()}", repr(kind(outside)))


    assert "\n" not in message


@pytest.mark.parametrize(("var", "raw", "key"), [
    ("WURK_SHUTDOWN_TIMEOUT", "1e10", "shutdown_timeout"),
    ("WURK_CONCURRENCY", "10000000", "concurrency"),
    ("WURK_QUEUES", "a:100000000000", "queues"),
])
def test_absurd_numbers_from_the_environment(var: str, raw: str, key: str) -> None:
    assert_names(error_of(env={var: raw}), "environment", key)


# -- the Redis URL, checked whole -------------------------------------------------

@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost",
        "redis://cache.internal:6380",
        "redis://cache.internal:6380/",
        "rediss://app:pw@cache.internal:6380/3",
        "redis://:pw@10.0.0.1:6379/15?socket_timeout=5&client_name=w",
        "redis://[::1]:6379/0",
        "redis://h/0?password=pw",
        "unix:///run/redis/redis.sock",
        "unix:///run/redis/redis.sock?db=2",
        "rediss://h:6380/0?ssl_cert_reqs=none",
        "REDIS://h:6379/1",
    ],
)
def test_good_redis_urls_pass(url: str) -> None:
    assert Config(redis_url=url).redis_url == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:6379/0", "must start with redis://, rediss:// or unix://"),
        ("redis:h:6379", "must start with"),
        ("redis://h:99999/0", "port from 1 to 65535"),
        ("redis://h:0/0", "port from 1 to 65535"),
        ("redis://h:abc/0", "port from 1 to 65535"),
        ("redis://h:6379/abc", "db that is a non-negative integer"),
        ("redis://h:6379/-1", "db that is a non-negative integer"),
        ("redis://h:6379/1/2", "db that is a non-negative integer"),
        ("redis://h:6379/99999999999", "db that is a non-negative integer"),
        ("redis://h:6379?db=x", "db that is a non-negative integer"),
        ("redis://h:6379/1?db=2", "names its db twice"),
        ("unix:///tmp/r.sock?db=abc", "db that is a non-negative integer"),
        ("redis://:6379/0", "must name a host"),
        ("redis://", "must name a host"),
        ("unix://", "socket path"),
        ("unix://host/tmp/r.sock", "socket path"),
        ("redis://h/0?protocol=3", "may only ask for protocol=2"),
        ("redis://h/0?ssl_cert_reqs=none", "unsupported option 'ssl_cert_reqs'"),
        ("redis://h/0?foo=bar", "unsupported option 'foo'"),
        ("redis://h/0?db=1&db=2", "more than once"),
        ("redis://[::1/0", "is not a valid URL"),
    ],
)
def test_bad_redis_urls_are_named(url: str, why: str) -> None:
    message = error_of(env={"REDIS_URL": url})
    assert_names(message, "environment", "redis_url", why, repr(url))


def test_sentinel_url_needs_no_host() -> None:
    config = Config(redis_url="redis://:pw@/2", sentinels=["s1:26379"], sentinel_master="m")
    assert config.redis_url == "redis://:pw@/2"


@pytest.mark.parametrize("address", ["s1:99999", "s1:0", "s1:²", "u:pw@s1:26379", "s1/x:1"])
def test_sentinel_addresses_need_a_plain_host_and_a_real_port(address: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config(sentinels=[address], sentinel_master="m")
    assert_names(str(err.value), "sentinels", "port from 1 to 65535")


# -- no password in any message ----------------------------------------------------

SECRET = "s3cr3t-Pw"


@pytest.mark.parametrize(
    ("env", "masked"),
    [
        ({"REDIS_URL": f"http://user:{SECRET}@h:6379/0"}, "http://user:***@h:6379/0"),
        ({"REDIS_URL": f"redis://:{SECRET}@h:99999/0"}, "redis://:***@h:99999/0"),
        ({"REDIS_URL": f"rediss://:{SECRET}@h:6380/abc"}, "rediss://:***@h:6380/abc"),
        ({"REDIS_URL": f"redis://h:1/0?password={SECRET}&db=x"},
         "redis://h:1/0?password=***&db=x"),
        ({"REDIS_URL": f"redis://:pa/{SECRET}@h/0?foo=1"}, "redis://:***@h/0?foo=1"),
        ({"REDIS_URL": f"redis://{SECRET}@h:0/0"}, "redis://***@h:0/0"),
        ({"REDIS_URL": f":{SECRET}@localhost:6379"}, ":***@localhost:6379"),
        ({"WURK_REDIS_URL": f"unix://:{SECRET}@/"}, "unix://:***@/"),
        ({"WURK_METRICS_URL": f"tcp://u:{SECRET}@h:1"}, "tcp://u:***@h:1"),
        ({"WURK_SENTINELS": f"u:{SECRET}@s1:26379", "WURK_SENTINEL_MASTER": "m"},
         "u:***@s1:26379"),
    ],
)
def test_errors_never_show_a_password(env: dict[str, str], masked: str) -> None:
    message = error_of(env=env)
    assert SECRET not in message
    assert masked in message


def test_type_and_unknown_key_errors_never_show_a_password(tmp_path: Path) -> None:
    for line in (f"sentinel_password = [\"{SECRET}\"]",
                 f'redis_ur = "redis://:{SECRET}@h:6379/0"',
                 f'redis_password = "{SECRET}"',
                 f'extra = {{ url = "redis://:{SECRET}@h", password = "{SECRET}" }}'):
        message = error_of(write_toml(tmp_path, f"[wurk]\n{line}\n"), env={})
        assert SECRET not in message and "***" in message, message
    message = error_of(write_toml(tmp_path, f'wurk = "redis://:{SECRET}@h"\n'), env={})
    assert SECRET not in message and "***" in message


def test_repr_of_a_config_never_shows_a_password() -> None:
    config = Config(redis_url=f"redis://app:{SECRET}@h:6379/0?password={SECRET}",
                    sentinels=["s1:26379"], sentinel_master="m", sentinel_password=SECRET)
    shown = repr(config)
    assert SECRET not in shown and SECRET not in str(config)
    assert "redis_url='redis://app:***@h:6379/0?password=***'" in shown
    assert "concurrency=10" in shown


def test_a_bad_redis_url_in_the_process_environment_blames_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://h:6379/abc")
    assert_names(error_of(), "environment: REDIS_URL: redis_url", "'redis://h:6379/abc'")
    assert_names(error_of(redis_url="redis://h:1/x"), "arguments: redis_url", "'redis://h:1/x'")

"""Each setting is declared once (wurk.settings.declared): the Config class,
the environment's variables, the ``wurk run`` options and the generated
docs/reference/settings.md all agree with that table."""

from __future__ import annotations

import dataclasses
import runpy
from pathlib import Path
from typing import Any

import pytest

from supervisor.parent_keys import PARENT_KEYS, SLOT_PARENT_KEYS
from supervisor.topology import RANGES as TOPOLOGY_RANGES
from supervisor.topology import SWARM_KEYS, Topology
from wurk import cli as wurk_cli
from wurk.settings import reference
from wurk.settings.config import Config, settable_fields
from wurk.settings.declaration import DECLARED, KINDS, config_fields
from wurk.settings.declared import BY_NAME, HOOKS, RANGES, SETTINGS
from wurk.settings.flags import flag_values
from wurk.settings.values import environment_layer

ROOT = Path(__file__).resolve().parent.parent


GENERATOR = runpy.run_path(str(ROOT / "scripts" / "settings-reference"),
                           run_name="settings_reference")


def test_the_committed_reference_page_is_what_the_generator_writes() -> None:
    committed = (ROOT / reference.PATH).read_text(encoding="utf-8")
    assert committed == GENERATOR["render"](), (
        f"{reference.PATH} is stale: run `{reference.COMMAND}` to regenerate it")


def test_the_check_mode_finds_a_stale_page(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "settings.md"
    main = GENERATOR["main"]
    assert main(["--check", str(page)]) == 1
    assert "run `scripts/settings-reference`" in capsys.readouterr().err
    assert main([str(page)]) == 0
    assert main(["--check", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == GENERATOR["render"]()
    assert "## The swarm parent's keys" in page.read_text(encoding="utf-8")


def test_config_has_exactly_the_declared_attributes_in_order() -> None:
    declared = [(d.name, d.annotation) for d in (*SETTINGS, *HOOKS)]
    assert list(Config.__annotations__.items()) == declared
    assert [f.name for f in dataclasses.fields(Config)] == [name for name, _ in declared]
    assert settable_fields() == {s.name for s in SETTINGS}


def test_each_default_is_the_declared_one() -> None:
    config = Config(redis_url="redis://localhost:6379/0")
    for setting in SETTINGS:
        assert getattr(config, setting.name) == setting.default, setting.name
    for hook in HOOKS:
        assert getattr(config, hook.name) == ([] if hook.many else None), hook.name
    # A list default is a fresh copy for each Config, never the table's own list.
    config.queues.append("extra")
    assert Config().queues == ["default"] == BY_NAME["queues"].default


def test_secrets_and_hooks_stay_out_of_repr() -> None:
    hidden = {f.name for f in dataclasses.fields(Config) if not f.repr}
    assert hidden == {"sentinel_password", "web_password", *(h.name for h in HOOKS)}


def test_a_class_that_differs_from_the_table_is_refused_at_import() -> None:
    one = SETTINGS[:1]
    with pytest.raises(TypeError, match=r"redis_url is annotated 'int' but declared 'str'"):
        @config_fields(one, ())
        class Wrong:
            redis_url: int = DECLARED

    with pytest.raises(TypeError, match=r"extra is annotated 'str' but declared None"):
        @config_fields(one, ())
        class Extra:
            redis_url: str = DECLARED
            extra: str = DECLARED

    with pytest.raises(TypeError, match=r"redis_url must be set to DECLARED"):
        @config_fields(one, ())
        class Plain:
            redis_url: str = "redis://x"


def test_every_declared_type_is_known_and_every_range_is_numeric() -> None:
    for setting in SETTINGS:
        assert setting.annotation in KINDS, setting.name
        if setting.range is not None:
            assert int in setting.types, setting.name
        assert not (setting.range and setting.choices), setting.name
        assert setting.default is None or isinstance(setting.default, setting.types), setting.name


def test_each_setting_is_read_from_its_declared_variables() -> None:
    raw = {"redis_url": "redis://elsewhere:6379/1", "tag": "t", "concurrency": "7",
           "queues": "a, b", "reliable_fetch": "off", "poll_interval_average": "2"}
    env = {BY_NAME[name].env: value for name, value in raw.items()}
    values, sources = environment_layer(env)
    assert values == {"redis_url": "redis://elsewhere:6379/1", "tag": "t", "concurrency": 7,
                      "queues": ["a", "b"], "reliable_fetch": False,
                      "poll_interval_average": 2}
    assert sources["concurrency"] == "environment: WURK_CONCURRENCY"
    assert environment_layer({"REDIS_URL": "redis://r:1/0"})[1]["redis_url"] == (
        "environment: REDIS_URL")
    assert environment_layer({})[1] == {"redis_url": "default"}


def parsed(*argv: str) -> dict[str, Any]:
    return flag_values(wurk_cli.build_parser().parse_args(["run", *argv]))


def test_the_run_options_are_the_declared_flags() -> None:
    assert parsed() == dict.fromkeys(s.name for s in SETTINGS if s.flag)
    given = parsed("-c", "3", "-q", "a:2", "--queue", "b", "-r", "m", "-t", "1.5", "-g", "x",
                   "--log-level", "debug", "--redis-url", "redis://h:1/0",
                   "--executor", "asyncio", "--max-jobs", "500")
    assert given == {"concurrency": 3, "queues": ["a:2", "b"], "require": ["m"],
                     "shutdown_timeout": 1.5, "tag": "x", "log_level": "debug",
                     "redis_url": "redis://h:1/0", "executor": "asyncio", "max_jobs": 500}


def test_the_run_help_keeps_each_options_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        wurk_cli.build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("-c CONCURRENCY, --concurrency CONCURRENCY worker threads (default 10)",
                  "-q QUEUE, --queue QUEUE queue to poll, NAME or NAME:WEIGHT; repeatable, in "
                  "priority order",
                  "-r REQUIRE, --require REQUIRE module (or .py file) that defines jobs; "
                  "repeatable",
                  "-t TIMEOUT, --timeout TIMEOUT shutdown timeout in seconds",
                  "-g TAG, --tag TAG a tag shown in the process list",
                  "-C CONFIG, --config CONFIG TOML file with a [wurk] table",
                  "--redis-url URL Redis to use (default: the config's, WURK_REDIS_URL, "
                  "REDIS_URL, or localhost)",
                  "--log-level LOG_LEVEL debug, info, warning, error, critical"):
        assert words in text, words


def test_only_wurk_settings_are_read_from_the_environment() -> None:
    assert all(s.from_env for s in SETTINGS)
    assert not any(k.from_env or k.flag for k in PARENT_KEYS)
    assert not {k.name for k in PARENT_KEYS} & settable_fields()


def test_the_topology_is_built_from_the_parent_keys() -> None:
    assert {k.name for k in PARENT_KEYS} == SWARM_KEYS
    assert set(SLOT_PARENT_KEYS) <= SWARM_KEYS
    own = {f.name: f for f in dataclasses.fields(Topology)}
    # path, base, slots and periodic are the file's own; the rest are parent keys.
    assert list(own)[4:] == [k.name for k in PARENT_KEYS]
    for key in PARENT_KEYS:
        assert own[key.name].default == key.default, key.name
        if key.range is not None:
            integral = key.annotation.startswith("int")
            assert TOPOLOGY_RANGES[key.name] == (integral, key.range.low, key.range.high)
    for name in ("concurrency", "shutdown_timeout"):
        assert TOPOLOGY_RANGES[name][1:] == (RANGES[name].low, RANGES[name].high)

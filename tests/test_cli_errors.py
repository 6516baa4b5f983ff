"""The errors a person meets at the command line: one line, the close match
for a typo, options in any order, and the user's own line for a module that
cannot be imported."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from admin_cli import Cli
from admin_cli import cli as cli
from cli_workers import REPO
from conftest import free_port

import wurk.cli
from supervisor.topology import SLOT_KEYS, SWARM_KEYS, TopologyError, parse
from supervisor.topology_periodic import KEYS as PERIODIC_KEYS
from wurk.settings.config import Config, ConfigError, settable_fields

pytestmark = pytest.mark.timeout(120)
DEAD_REDIS = f"redis://127.0.0.1:{free_port()}/0"


def run(*argv: str, swarm: bool = False, cwd: Path = REPO,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update({"REDIS_URL": DEAD_REDIS, "PYTHONPATH": str(REPO), "COLUMNS": "100",
                **(extra_env or {})})
    module = "supervisor.cli" if swarm else "wurk.cli"
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


# -- one-line usage errors -------------------------------------------------------
@pytest.mark.parametrize(("argv", "prog", "needle"), [
    ((), "wurk", "the following arguments are required: command"),
    (("stat",), "wurk", "invalid choice: 'stat'"),
    (("stats", "--bogus"), "wurk stats", "unrecognized arguments: --bogus"),
    (("scheduled", "nuke"), "wurk scheduled", "invalid choice: 'nuke'"),
    (("pause",), "wurk pause", "the following arguments are required: QUEUE"),
    (("retries", "--limit", "many"), "wurk retries", "argument --limit"),
    (("run", "--concurrency"), "wurk run", "expected one argument"),
    (("--json", "run"), "wurk run", "no --json"),
    (("web", "--poll", "0"), "wurk web", "argument --poll"),
])
def test_a_command_line_that_does_not_parse_is_one_line(argv: tuple[str, ...], prog: str,
                                                        needle: str) -> None:
    done = run(*argv)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{prog}: ") and needle in line, line
    assert line.endswith(f"(see {prog} --help)"), line
    assert done.stdout == ""


@pytest.mark.parametrize(("argv", "needle"), [
    ((), "the following arguments are required: -t/--topology"),
    (("-t",), "expected one argument"),
    (("-t", "x.toml", "--pid", "-5", "--probe"), "argument --pid"),
])
def test_a_swarm_command_line_that_does_not_parse_is_one_line(argv: tuple[str, ...],
                                                              needle: str) -> None:
    done = run(*argv, swarm=True)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("wurk-swarm: ") and needle in line, line
    assert line.endswith("(see wurk-swarm --help)"), line


def subcommands(parser: argparse.ArgumentParser,
                path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                          argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommands(sub, (*path, name))


# The top level, and subcommands that intermix options and positionals.
@pytest.mark.parametrize("path", [(), ("run",), ("scheduled",), ("unique",), ("spool",)],
                         ids=lambda path: " ".join(path) or "wurk")
def test_help_is_what_argparse_prints(path: tuple[str, ...],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Options parsed in any order must not change --help (argparse swaps the usage
    text while it intermixes)."""
    monkeypatch.setenv("COLUMNS", "100")  # the same width as the subprocess's
    parser = dict(subcommands(wurk.cli.build_parser()))[path]
    done = run(*path, "--help")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == parser.format_help()


# -- options in any order ----------------------------------------------------------
def sample_words(parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Positional words that act on something, and every option with a valid value."""
    words: list[str] = []
    for action in parser._get_positional_actions():
        choices = list(action.choices or [])
        words += ([choices[1] if len(choices) > 1 else choices[0]] if choices
                  else ["x1", "x2"] if action.nargs in ("*", "+") else ["x1"])
    options: list[str] = []
    for action in parser._get_optional_actions():
        name = max(action.option_strings, key=len)
        if action.nargs == 0:
            options.append(name) if name not in ("--help", "--version") else None
        elif name not in ("--config", "--redis-url"):
            options += [name, str(next(iter(action.choices))) if action.choices else "1"]
    return words, options


def orders(words: list[str], options: list[str]) -> list[list[str]]:
    return [[*words, *options], [*options, *words], [*words[:1], *options, *words[1:]],
            [*words[:-1], *options, *words[-1:]]]


WITH_POSITIONALS = [(path, parser) for path, parser in subcommands(wurk.cli.build_parser())
                    if path and parser._get_positional_actions()]


@pytest.mark.parametrize(("path", "parser"), WITH_POSITIONALS,
                         ids=[" ".join(path) for path, _ in WITH_POSITIONALS])
def test_options_may_come_before_between_or_after_the_arguments(
        path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    words, options = sample_words(parser)
    parsed = [vars(wurk.cli.build_parser().parse_args([*path, *order]))
              for order in orders(words, options)]
    assert all(p == parsed[0] for p in parsed), parsed


@pytest.mark.parametrize("order", [("delete", "--yes", "JID"), ("delete", "JID", "--yes"),
                                   ("--yes", "delete", "JID")])
def test_scheduled_delete_takes_yes_anywhere(cli: Cli, r: redis.Redis,
                                             order: tuple[str, ...]) -> None:
    jid = "0123456789abcdef01234567"
    r.zadd("schedule", {f'{{"class":"J","args":[],"jid":"{jid}","queue":"q"}}': 1e10})
    result = cli("scheduled", *(jid if word == "JID" else word for word in order))
    assert result.code == 0, result.err
    assert r.zcard("schedule") == 0


# -- did you mean ------------------------------------------------------------------
SLOT = '[[slot]]\nname = "a"\n'


@pytest.mark.parametrize(("toml", "needle"), [
    ('[[slots]]\nname = "a"\n', "unknown key 'slots' at the top level (did you mean 'slot'?)"),
    ('[wurk]\nconcurency = 4\n' + SLOT, "unknown key 'concurency' (set to 4) "
                                        "(did you mean 'concurrency'?)"),
    ('[wurk]\nshutdown_grase = 4\n' + SLOT, "(did you mean 'shutdown_grace'?)"),
    (SLOT + 'cuont = 2\n', "unknown key 'cuont' (did you mean 'count'?)"),
    (SLOT + '[[periodic]]\nshedule = "@daily"\njob = "J"\n',
     "unknown key 'shedule' (did you mean 'schedule'?) (known: "),
])
def test_a_topology_key_typo_names_the_key_meant(toml: str, needle: str) -> None:
    with pytest.raises(TopologyError) as raised:
        parse(tomllib.loads(toml), Path("topology.toml"), env={})
    assert needle in str(raised.value)


def test_a_settings_key_typo_in_wurk_run_config_names_the_key_meant(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text("[wurk]\nconcurency = 4\n")
    with pytest.raises(ConfigError, match=r"\(did you mean 'concurrency'\?\)"):
        Config.load(tmp_path / "w.toml", env={})
    done = run("run", "-C", str(tmp_path / "w.toml"))
    assert done.returncode == wurk.cli.EX_CONFIG
    [line] = done.stderr.splitlines()
    assert "unknown key 'concurency'" in line and "did you mean 'concurrency'?" in line


@pytest.mark.parametrize(("argv", "swarm", "needle"), [
    (("-t", "x.toml", "--chekc"), True, "--chekc (did you mean '--check'?)"),
    (("stats", "--jsno"), False, "--jsno (did you mean '--json'?)"),
    (("scheduled", "delte"), False, "(did you mean 'delete'?)"),
])
def test_an_option_typo_names_the_option_meant(argv: tuple[str, ...], swarm: bool,
                                               needle: str) -> None:
    done = run(*argv, swarm=swarm)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert needle in line


# -- a job module that cannot be imported ------------------------------------------
@pytest.fixture
def app(tmp_path: Path) -> Path:
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text("import wurk\nfrom myapp import helpers\n")
    (package / "helpers.py").write_text(textwrap.dedent("""\
        import json

        import missing_dependency_for_the_test
    """))
    return tmp_path


def test_an_import_failure_names_the_users_line(app: Path) -> None:
    done = run("run", "-r", "myapp.jobs", cwd=app, extra_env={"PYTHONPATH": str(REPO)})
    assert done.returncode == wurk.cli.EX_CONFIG
    [line] = done.stderr.splitlines()
    assert line == ("wurk: cannot load jobs: myapp.jobs: ModuleNotFoundError: No module named "
                    "'missing_dependency_for_the_test' (at myapp/helpers.py:3)")


def test_an_import_failure_logs_the_traceback_at_debug(app: Path) -> None:
    done = run("run", "-r", "myapp.jobs", "--log-level", "debug", cwd=app,
               extra_env={"PYTHONPATH": str(REPO), "WURK_LOG_FORMAT": "console"})
    assert done.returncode == wurk.cli.EX_CONFIG
    assert "jobs.import_failed" in done.stderr and "Traceback" in done.stderr
    assert 'myapp/jobs.py", line 2' in done.stderr
    assert done.stderr.splitlines()[-1].endswith("(at myapp/helpers.py:3)")


def test_a_module_that_raises_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import os\n\nvalue = 1 / 0\n")
    for name in ("broken", "broken.py"):
        done = run("run", "-r", name, cwd=tmp_path)
        [line] = done.stderr.splitlines()
        assert line == f"wurk: cannot load jobs: {name}: ZeroDivisionError: division by zero " \
                       "(at broken.py:3)"


# -- every topology key, given a hostile value ---------------------------------------
HOSTILE_VALUES = (0, -1, 1.5, float("nan"), float("inf"), -float("inf"), 10**30, 1e308, "",
                  "a\nb", True, [], {}, ["a\nb"], [""])


def hostile_documents() -> Iterator[tuple[str, dict[str, object]]]:
    """(an id, a topology document with one key of one table set to a hostile value)."""
    slot = {"name": "a"}
    entry = {"schedule": "@daily", "job": "J"}
    for value in HOSTILE_VALUES:
        for key in sorted(settable_fields() | SWARM_KEYS):
            yield f"[wurk] {key}={value!r}", {"wurk": {key: value}, "slot": [slot]}
        for key in sorted(SLOT_KEYS):
            yield f"[[slot]] {key}={value!r}", {"slot": [{**slot, key: value}]}
        for key in sorted(PERIODIC_KEYS):
            yield (f"[[periodic]] {key}={value!r}",
                   {"slot": [slot], "periodic": [{**entry, key: value}]})
        yield f"slot={value!r}", {"slot": value}
        yield f"periodic={value!r}", {"slot": [slot], "periodic": value}


def test_every_topology_key_refuses_a_hostile_value_with_a_topology_error() -> None:
    """A value a topology key cannot take is a TopologyError naming it (exit 78 in one
    line), never another exception (a traceback)."""
    crashes = []
    for name, document in hostile_documents():
        try:
            parse(document, Path("topology.toml"), env={})
        except TopologyError:
            pass
        except Exception as exc:  # noqa: BLE001 - collected, then reported together
            crashes.append(f"{name}: {type(exc).__name__}: {exc}")
    assert crashes == []

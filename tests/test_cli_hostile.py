"""Every option and argument of ``wurk`` and ``wurk-swarm``, given a hostile
value, gets a one-line answer: a non-zero exit, exactly one line on stderr,
never a traceback.

The cases are derived from the parsers themselves (``wurk.cli.build_parser``,
``supervisor.cli.build_parser``), so an option added later is covered without
touching this file. Each case runs the real command in a subprocess. So that
a value the command accepts also ends in a one-line failure instead of
running on, every command gets surroundings that fail after the value was
used: Redis is a closed port, ``wurk run`` requires a module that does not
exist, ``wurk web`` binds a busy port on an address this machine lacks, and
``wurk-swarm --probe`` asks a Redis that does not answer.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_workers import REPO
from conftest import free_port

import supervisor.cli
import wurk.cli

TOPOLOGY = Path("topology.toml")
BUSY = "{busy port}"  # replaced by a port something listens on
DEAD_REDIS = f"redis://127.0.0.1:{free_port()}/0"
# Values any numeric option meets from a slip of the keyboard or a script's bug.
HOSTILE_INT = ("0", "-1", "99999999999999999999", "1.5", "")
HOSTILE_FLOAT = ("0", "-1", "nan", "inf", "1e20", "abc", "")
HOSTILE_STR = ("", "a\nb", "x" * 5000)
# Actions that take no value.
NO_VALUE = (argparse._StoreTrueAction, argparse._HelpAction, argparse._VersionAction,
            argparse._SubParsersAction)


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        return " ".join(a if len(a) < 20 else a[:8] + "..." for a in self.argv).replace("\n", "\\n")


def leaves(parser: argparse.ArgumentParser,
           path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each parser that takes arguments itself, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaves(sub, (*path, name))


def hostile_values(action: argparse.Action) -> tuple[str, ...]:
    """By the option's type: int, float, or wurk.core.arguments.number (whose name
    says "an integer ..." or "a number ..."); anything else takes text."""
    name = getattr(action.type, "__name__", "")
    if action.type is int or name.startswith("an integer"):
        return HOSTILE_INT
    if action.type is float or name.startswith("a number"):
        return HOSTILE_FLOAT
    return HOSTILE_STR


def surroundings(path: tuple[str, ...]) -> list[str]:
    """The arguments that make ``path`` fail in one line once it is past its options."""
    if path[0] == "wurk-swarm":
        return ["--topology", str(TOPOLOGY), "--probe"]
    if path[1:] == ("run",):
        return ["--require", "no_such_module_for_the_hostile_test"]
    if path[1:] == ("web",):
        return ["--bind", "192.0.2.1", "--port", BUSY]
    return []


def positional_prefix(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Plausible words for the positionals before ``action`` (an action that
    acts on what follows, never the default ``list``)."""
    words: list[str] = []
    for before in parser._get_positional_actions():
        if before is action:
            return words
        choices = list(before.choices or ["x"])
        words.append(choices[1] if len(choices) > 1 else choices[0])
    return words


def cases() -> list[Case]:
    found: list[Case] = []
    seen: set[int] = set()
    parsers = [(("wurk",), wurk.cli.build_parser()),
               (("wurk-swarm",), supervisor.cli.build_parser())]
    for top, root in parsers:
        for path, parser in leaves(root, top):
            for action in parser._actions:
                # Options shared through parents= are one action: test each once.
                if isinstance(action, NO_VALUE) or id(action) in seen:
                    continue
                seen.add(id(action))
                found += [Case(argv) for argv in arguments(path, parser, action)]
    return found


def arguments(path: tuple[str, ...], parser: argparse.ArgumentParser,
              action: argparse.Action) -> Iterator[tuple[str, ...]]:
    around = surroundings(path)
    for value in hostile_values(action):
        if action.option_strings:
            option = max(action.option_strings, key=len)
            yield (*path, f"{option}={value}", *without(around, option))
        else:
            yield (*path, *positional_prefix(parser, action), value, *around)


def without(words: list[str], option: str) -> list[str]:
    """``words`` (options and their values) without ``option``, which the case sets."""
    pairs = [words[i:i + 2] for i in range(0, len(words), 2)]
    return [word for pair in pairs if pair[0] != option for word in pair]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("case", cases(), ids=lambda case: case.id)
def test_a_hostile_value_gets_one_line(case: Case, tmp_path: Path, busy_port: int) -> None:
    (tmp_path / TOPOLOGY).write_text(f'[wurk]\nredis_url = "{DEAD_REDIS}"\n'
                                     '[[slot]]\nname = "a"\nrequire = ["os"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update({"REDIS_URL": DEAD_REDIS, "PYTHONPATH": str(REPO)})
    module = "supervisor.cli" if case.argv[0] == "wurk-swarm" else "wurk.cli"
    words = [word.replace(BUSY, str(busy_port)) for word in case.argv[1:]]
    done = subprocess.run([sys.executable, "-m", module, *words], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    # `wurk workflows show` reports an id it cannot read in its document, on stdout
    # (docs/reference/admin-cli.md): there the one line is on stdout.
    said = done.stdout if case.argv[1:3] == ("workflows", "show") and not done.stderr \
        else done.stderr
    assert said.count("\n") == 1 and said.endswith("\n"), done.stderr

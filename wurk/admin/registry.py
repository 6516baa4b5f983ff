"""The admin subcommand registry and the context every command runs with.

Duties:
1. :class:`AdminCommand`: one subcommand as data: its name, help, how it
   adds its arguments, and the function that runs it.
2. :class:`Registry`: the commands ``wurk`` offers next to ``run``. It
   refuses a duplicate name, installs every command as an argparse
   subparser that also takes the global options (``--redis-url``,
   ``-C/--config``, ``--json``), and tags each parsed namespace with its
   command so ``wurk.cli`` can dispatch without knowing any of them.
3. :class:`Context`: the loaded config, the output streams and the moment
   of the call; ``emit`` prints one payload as JSON or as the command's
   human rendering, so the two outputs never disagree.
4. The errors a command raises to fail with exit status 1 (``CommandError``)
   or 2 (``UsageError``), and :func:`limit_type`, the range every ``--limit``
   is parsed with.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from wurk.admin.output import to_json
from wurk.core.arguments import number
from wurk.redis.runtime import Runtime, runtime_for
from wurk.settings.config import Config

Render = Callable[[Any, float], list[str]]
# The most entries one listing takes: past it, a slip of the keyboard, not a wish.
MAX_LISTED = 1_000_000
GLOBAL_OPTIONS = ("redis_url", "config", "json")


class CommandError(Exception):
    """The command could not do what was asked; the message says what and why (exit 1)."""


class UsageError(Exception):
    """The arguments do not make sense together (exit 2, as argparse's own errors)."""


@dataclass
class Context:
    config: Config
    json: bool = False
    out: TextIO | None = None
    err: TextIO | None = None
    now: float = field(default_factory=time.time)
    # The command's pools, found once for its config (the API objects it
    # builds from the same config share them).
    runtime: Runtime = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = runtime_for(self.config)

    def emit(self, payload: Any, render: Render) -> None:
        """Print ``payload`` as the ``--json`` document, or as ``render`` draws it."""
        text = to_json(payload) if self.json else "\n".join(render(payload, self.now))
        print(text, file=self.out)

    def warn(self, message: str) -> None:
        print(f"wurk: {message}", file=self.err)

    def confirm(self, question: str, *, what: str) -> None:
        """Ask before destroying jobs: on a terminal a y/N question; anywhere
        else the command must carry ``--yes`` (UsageError, exit 2)."""
        if not sys.stdin.isatty():
            raise UsageError(f"{what} for good: confirm with --yes (stdin is not a terminal)")
        print(f"{question} [y/N] ", end="", file=self.err or sys.stderr, flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise CommandError("not confirmed: nothing was changed")


@dataclass(frozen=True)
class AdminCommand:
    name: str
    help: str
    run: Callable[[Context, argparse.Namespace], int | None]
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    description: str | None = None


class Registry:
    """Admin commands by name, in the order ``wurk --help`` lists them."""

    def __init__(self, *commands: AdminCommand) -> None:
        self._commands: dict[str, AdminCommand] = {}
        for command in commands:
            self.add(command)

    def add(self, command: AdminCommand) -> AdminCommand:
        if command.name in self._commands or command.name == "run":
            raise ValueError(f"an admin command named {command.name!r} already exists")
        self._commands[command.name] = command
        return command

    def __iter__(self) -> Iterator[AdminCommand]:
        return iter(self._commands.values())

    def __contains__(self, name: object) -> bool:
        return name in self._commands

    def install(self, subparsers: Any) -> None:
        """Add one subparser per command to ``wurk``'s subparsers action."""
        common = global_options(argparse.ArgumentParser(add_help=False))
        for command in self:
            parser = subparsers.add_parser(
                command.name, help=command.help, parents=[common],
                description=command.description or command.help)
            command.arguments(parser)
            parser.set_defaults(admin_command=command)


def limit_type(low: int = 1) -> Callable[[str], int]:
    """A ``--limit`` option's type: an integer from ``low`` (0 where it means all)
    to MAX_LISTED, anything else a one-line usage error."""
    parse: Callable[[str], int] = number(int, low, MAX_LISTED)
    return parse


def global_options(parser: argparse.ArgumentParser, prefix: str = "") -> argparse.ArgumentParser:
    """``--redis-url``, ``-C/--config`` and ``--json``; ``prefix`` names their dests
    apart on the top-level parser, so an admin command's own values win."""
    parser.add_argument("--redis-url", dest=f"{prefix}redis_url", metavar="URL",
                        help="Redis to talk to (default: the config's, REDIS_URL, or localhost)")
    parser.add_argument("-C", "--config", dest=f"{prefix}config", metavar="FILE",
                        help="TOML file with a [wurk] table, as wurk run reads")
    parser.add_argument("--json", dest=f"{prefix}json", action="store_true",
                        help="print the stable JSON document instead of a table")
    return parser

"""The command-line parser of ``wurk`` and ``wurk-swarm``, and the option types it checks.

Duties:
1. :class:`Parser`: argparse with the errors docs/reference/admin-cli.md
   promises: one line on stderr, ``PROG: message (see PROG --help)``, exit 2
   (argparse's usage status), where PROG names the subcommand the mistake
   is in (``wurk scheduled: ...``). ``--help`` prints what argparse prints.
2. Options and positional arguments in any order within a subcommand
   (``delete --yes JID`` as ``delete JID --yes``): argparse would give the
   positionals to the first run of words it meets and leave the rest over.
3. Words a subcommand does not take are that subcommand's error, named with
   its own name instead of the top-level ``wurk``.
4. :func:`one_line`: an error message as one line, whatever the value it
   quotes holds (a path typed with a newline).
5. :func:`number`: an option type that refuses, in the same one line, what
   is not a finite number within the option's bounds (0, -1, NaN, inf, a
   huge number), before any code sees it; :func:`word`, the same for a
   value that must not be empty (``--bind ''`` would listen everywhere).
6. An unknown subcommand or choice names the close match
   (:func:`wurk.core.suggest.did_you_mean`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from wurk.core.suggest import did_you_mean

EX_USAGE = 2
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """``text`` with its control characters as ``\\xNN`` escapes (as
    ``wurk.admin.output.printable``, a layer above, shows Redis text): a newline or an
    ESC in a typed value must not break an error's one line or drive the terminal."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def usage_error(prog: str, message: str) -> NoReturn:
    """Print ``prog``'s usage error as one line on stderr and exit 2."""
    sys.stderr.write(f"{prog}: {one_line(message)} (see {prog} --help)\n")
    sys.exit(EX_USAGE)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and options anywhere among the positionals."""

    _intermixing = False

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", Subcommand)
        return super().add_subparsers(**kwargs)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.refuse(extras)
        return parsed

    # typeshed overloads these on the namespace's type; every caller here
    # takes argparse's own Namespace.
    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[Any, list[str]]:
        # parse_known_intermixed_args calls back here for each of its two
        # passes: those run plain argparse. A parser with subcommands cannot
        # intermix (its subcommand takes every word after its name).
        if self._intermixing or self._subcommands():
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            hint = did_you_mean(value, action.choices or ())
            raise argparse.ArgumentError(action, exc.message + hint) from None

    def _subcommands(self) -> bool:
        return any(a.nargs in (argparse.PARSER, argparse.REMAINDER)
                   for a in self._get_positional_actions())


    def refuse(self, extras: list[str]) -> NoReturn:
        """Words nothing took: named, with the option meant if one was mistyped."""
        options = [o for a in self._actions for o in a.option_strings]
        typo = next((w.split("=", 1)[0] for w in extras if w.startswith("-")), None)
        self.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(typo, options)}")


class Subcommand(Parser):
    """A subcommand's parser: words it does not take are its own error."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self._intermixing:
            self.refuse(extras)
        return parsed, extras


def number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    """An argparse ``type=`` for a finite ``kind`` from ``low`` to ``high`` inclusive."""
    noun = "an integer" if kind is int else "a number"
    bounds = f"{noun} from {_shown(low)} to {_shown(high)}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {bounds}, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected {bounds}, got {text!r}")
        return value

    parse.__name__ = bounds
    return parse


def word(what: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a non-empty value without control characters."""
    def parse(text: str) -> str:
        if not text or one_line(text) != text:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text

    parse.__name__ = what
    return parse


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)

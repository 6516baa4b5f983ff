"""Push-time argument checks: a job's arguments against its own signature.

A call that cannot work (one argument too many, one missing) should fail in
the process that makes it, with the job's name and signature, not minutes
later in a worker as a retry. Duties:

1. ``Arity.of``: read a job function's (or ``perform``'s) signature once, at
   registration, into the counts a call must fall between.
2. ``remember`` / ``check``: a table by wire name, filled by every registry,
   so any push path that knows only the name (``Client.push_bulk``) checks
   too. A name not in the table (a job defined in Ruby, or in a module this
   process never imported) is not checked.

Counting is O(1) per push: no ``Signature.bind`` on the hot path.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wurk.wire.payload import ArgumentError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class Arity:
    name: str
    least: int
    most: int | None  # None: takes *args
    shown: str
    # Why no push can ever satisfy it (a required keyword-only parameter).
    unusable: str | None = None

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any], *, bound: bool = False) -> Arity | None:
        """``bound``: ``fn`` is an unbound method whose first parameter is self."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins and C callables have none
            return None
        params = list(signature.parameters.values())[1 if bound else 0:]
        positional = [p for p in params if p.kind in _POSITIONAL]
        required_keywords = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY
                             and p.default is inspect.Parameter.empty]
        shown = str(signature.replace(parameters=params,
                                      return_annotation=inspect.Signature.empty))
        unusable = (f"its keyword-only parameter {required_keywords[0]!r} has no default, "
                    "and a job only receives positional arguments" if required_keywords
                    else None)
        return cls(name, sum(p.default is inspect.Parameter.empty for p in positional),
                   None if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
                   else len(positional), shown, unusable)

    def check(self, args: Sequence[Any], where: str = "") -> None:
        if self.unusable is not None:
            raise ArgumentError(f"{self.name}{self.shown} cannot be pushed: {self.unusable}")
        count = len(args)
        if count >= self.least and (self.most is None or count <= self.most):
            return
        raise ArgumentError(f"{self.name}{self.shown} takes {self._expected()}, "
                            f"got {count}{where}")

    def _expected(self) -> str:
        if self.most is None:
            return f"at least {_arguments(self.least)}"
        if self.least == self.most:
            return _arguments(self.least)
        return f"{self.least} to {_arguments(self.most)}"


def _arguments(count: int) -> str:
    return f"{count} argument" + ("" if count == 1 else "s")


_known: dict[str, Arity] = {}
_lock = threading.Lock()


def remember(name: str, arity: Arity | None) -> None:
    with _lock:
        if arity is None:
            _known.pop(name, None)
        else:
            _known[name] = arity


def forget(name: str) -> None:
    remember(name, None)


def check(name: str, args: Sequence[Any], where: str = "") -> None:
    """Raise ArgumentError if ``name`` is a job this process knows and ``args`` cannot fit."""
    arity = _known.get(name)
    if arity is not None:
        arity.check(args, where)

"""Push-time argument checks: a job's arguments against its own signature.

A call that cannot work (one argument too many, one missing, a keyword the
job does not take, a string where the job's annotation says int) should fail
in the process that makes it, with the job's name and signature, not minutes
later in a worker as a retry. Duties:

1. ``Arity.of``: read a job function's (or ``perform``'s) signature once, at
   registration, into what a call must satisfy: the positional counts, the
   keywords, and a JSON-type check per annotated parameter
   (:mod:`wurk.push.json_types`; off with ``check_types=False``).
2. ``remember`` / ``check``: a table by wire name, filled by every registry,
   so any push path that knows only the name (``Client.push_bulk``) checks
   too. A name not in the table (a job defined in Ruby, or in a module this
   process never imported) is not checked.

A positional push costs a count and one predicate per annotated argument:
no ``Signature.bind`` on the hot path. A keyword push checks its names
against sets built at registration.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wurk.push import json_types
from wurk.wire.payload import ArgumentError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_EMPTY = inspect.Parameter.empty
# One parameter's compiled check: its name, the predicate, the type's name, and
# the exact types taken without calling the predicate (the common case, inlined).
Typed = tuple[str, json_types.Predicate, str, frozenset[type]]


@dataclass(frozen=True)
class Arity:
    name: str
    least: int
    most: int | None  # None: takes *args
    shown: str
    positional: tuple[str, ...] = ()  # names, in order
    positional_only: int = 0  # how many of them cannot be given by keyword
    index: Mapping[str, int] = field(default_factory=dict)  # positional name -> place
    keywords: frozenset[str] = frozenset()  # names a keyword may use
    required_keywords: tuple[str, ...] = ()  # keyword-only without a default
    var_keyword: bool = False  # takes **kwargs
    # Type checks by position, for *args, by keyword name, for **kwargs.
    by_position: tuple[tuple[int, Typed], ...] = ()
    rest: Typed | None = None
    by_keyword: Mapping[str, Typed] = field(default_factory=dict)
    extra_keywords: Typed | None = None

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any], *, bound: bool = False,
           check_types: bool = True) -> Arity | None:
        """``bound``: ``fn`` is an unbound method whose first parameter is self."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins and C callables have none
            return None
        params = list(signature.parameters.values())[1 if bound else 0:]
        positional = [p for p in params if p.kind in _POSITIONAL]
        kinds = {p.kind for p in params}
        shown = str(signature.replace(parameters=params, return_annotation=_EMPTY))
        typed = _compiled(fn, params) if check_types else {}
        var_positional = next((p.name for p in params
                               if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
        var_keyword = next((p.name for p in params
                            if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return cls(
            name, sum(p.default is _EMPTY for p in positional),
            None if var_positional else len(positional), shown,
            positional=tuple(p.name for p in positional),
            index={p.name: i for i, p in enumerate(positional)},
            positional_only=sum(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params),
            keywords=frozenset(p.name for p in params if p.kind in keyword_kinds),
            required_keywords=tuple(p.name for p in params if p.default is _EMPTY
                                    and p.kind is inspect.Parameter.KEYWORD_ONLY),
            var_keyword=inspect.Parameter.VAR_KEYWORD in kinds,
            by_position=tuple((i, typed[p.name]) for i, p in enumerate(positional)
                              if p.name in typed),
            rest=typed.get(var_positional) if var_positional else None,
            by_keyword={p.name: typed[p.name] for p in params
                        if p.kind in keyword_kinds and p.name in typed},
            extra_keywords=typed.get(var_keyword) if var_keyword else None,
        )

    @property
    def typed(self) -> bool:
        return bool(self.by_position or self.rest or self.by_keyword or self.extra_keywords)

    def check(self, args: Sequence[Any], where: str = "",
              kwargs: Mapping[str, Any] | None = None, placeholders: int = 0) -> None:
        """Refuse a call that cannot fit. ``placeholders``: how many leading
        ``args`` stand for values the worker fills in (counted, not typed)."""
        count = len(args)
        if kwargs:
            self._bind(count, kwargs, where)
        elif self.required_keywords:
            self._refuse(f"needs keyword argument {self.required_keywords[0]!r}", where)
        elif count < self.least or (self.most is not None and count > self.most):
            self._refuse(f"takes {self._expected()}, got {count}", where)
        if self.by_position or self.rest:
            self._check_positional(args, placeholders, where)
        if kwargs and (self.by_keyword or self.extra_keywords):
            self._check_keywords(kwargs, where)

    def _bind(self, count: int, kwargs: Mapping[str, Any], where: str) -> None:
        """What ``Signature.bind`` would say of ``count`` positionals and ``kwargs``."""
        if self.most is not None and count > self.most:
            self._refuse(f"takes at most {_arguments(self.most)} by position, got {count}", where)
        self._known_keywords(count, kwargs, where)
        for at in range(count, self.least):
            key = self.positional[at]
            if at < self.positional_only or key not in kwargs:
                self._refuse(f"needs argument {key!r}", where)
        for key in self.required_keywords:
            if key not in kwargs:
                self._refuse(f"needs keyword argument {key!r}", where)

    def _known_keywords(self, count: int, kwargs: Mapping[str, Any], where: str) -> None:
        for key in kwargs:
            at = self.index.get(key)
            if at is not None and at < self.positional_only:
                if not self.var_keyword:
                    self._refuse(f"takes {key!r} by position only", where)
            elif at is not None and at < count:
                self._refuse(f"got {key!r} both by position and by keyword", where)
            elif key not in self.keywords and not self.var_keyword:
                self._refuse(f"has no parameter {key!r}", where)

    def _check_positional(self, args: Sequence[Any], placeholders: int, where: str) -> None:
        count = len(args)
        for at, (key, check, type_name, exact) in self.by_position:
            if placeholders <= at < count and type(args[at]) not in exact \
                    and not check(args[at]):
                self._wrong_type(key, type_name, args[at], where)
        if self.rest is not None:
            key, check, type_name, exact = self.rest
            for at in range(max(len(self.positional), placeholders), count):
                if type(args[at]) not in exact and not check(args[at]):
                    self._wrong_type(f"{key}[{at - len(self.positional)}]", type_name,
                                     args[at], where)

    def _check_keywords(self, kwargs: Mapping[str, Any], where: str) -> None:
        for key, value in kwargs.items():
            # A parameter's own name, or one that lands in **kwargs (a
            # positional-only name included).
            typed = (self.by_keyword.get(key) if key in self.keywords
                     else self.extra_keywords)
            if typed is not None and not typed[1](value):
                self._wrong_type(key, typed[2], value, where)

    def _wrong_type(self, key: str, type_name: str, value: Any, where: str) -> None:
        self._refuse(f"argument {key!r} must be {type_name}, got {type(value).__name__} "
                     f"{value!r:.60} (declare the job with check_types=False to allow it)", where)

    def _refuse(self, problem: str, where: str) -> None:
        raise ArgumentError(f"{self.name}{self.shown} {problem}{where}")

    def _expected(self) -> str:
        if self.most is None:
            return f"at least {_arguments(self.least)}"
        if self.least == self.most:
            return _arguments(self.least)
        return f"{self.least} to {_arguments(self.most)}"


def _compiled(fn: Callable[..., Any], params: list[inspect.Parameter]) -> dict[str, Typed]:
    """A JSON-type check for each parameter whose annotation names JSON types."""
    if all(p.annotation is _EMPTY for p in params):
        return {}
    try:
        source = inspect.unwrap(fn)  # where the annotations and their module are
    except ValueError:  # a __wrapped__ cycle
        source = fn
    hints = json_types.hints_of(source)
    typed: dict[str, Typed] = {}
    for p in params:
        compiled = json_types.compile_hint(hints[p.name]) if p.name in hints else None
        if compiled is not None:
            typed[p.name] = (p.name, compiled.check, compiled.shown,
                             compiled.exact or frozenset())
    return typed


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


def check(name: str, args: Sequence[Any], where: str = "",
          kwargs: Mapping[str, Any] | None = None, placeholders: int = 0) -> None:
    """Raise ArgumentError if ``name`` is a job this process knows and the call cannot fit."""
    arity = _known.get(name)
    if arity is not None:
        arity.check(args, where, kwargs, placeholders)

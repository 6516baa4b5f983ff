"""JSON-type checks of job arguments, compiled once from a job's annotations.

A job annotated ``(a: int, b: int)`` pushed with ``("1", "2")`` runs and
does the wrong thing (``"12"``) far from the push that caused it. Where an
annotation names JSON types, the push is refused instead. Duties:

1. ``compile_hint``: turn one annotation into a predicate on the pushed
   value and the name shown in the refusal, or None when the annotation is
   not a JSON type (a class of the application's, ``Any``, ``object``, a
   ``TypeVar``, ``tuple``...): those are not checked, since what such a
   value looks like as JSON is the application's business.
2. ``hints_of``: a function's resolved annotations, each resolved on its
   own where the whole set cannot be (a forward reference to a class
   defined later leaves only that parameter unchecked).

Understood: ``int``, ``float`` (an int is accepted, as PEP 484 says),
``str``, ``bool``, ``None``, ``list``/``list[X]``/``typing.List[X]``,
``dict``/``dict[str, X]``/``typing.Dict[str, X]``, unions (``X | None``,
``Optional``, ``Union``) whose members are all understood, ``Literal`` of
JSON scalars, and ``Annotated[X, ...]`` as ``X``. A bool is not an int here:
JSON keeps ``true`` and ``1`` apart, and so does a Ruby worker.
"""

from __future__ import annotations

import contextlib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union

Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class Compiled:
    """A compiled annotation: the predicate, the type as a refusal names it, and
    the exact types it takes with no further look (a container's elements are
    tested against them in one pass before the predicate is asked)."""

    check: Predicate
    shown: str
    exact: frozenset[type] | None = None


def _scalar(exact: tuple[type, ...], check: Predicate, shown: str) -> Compiled:
    types_ = frozenset(exact)
    # The exact type first: a subclass (an IntEnum, a str subclass) is asked.
    return Compiled(lambda v: type(v) in types_ or check(v), shown, types_)


_NONE_TYPE = type(None)
_SCALARS: dict[Any, Compiled] = {
    int: _scalar((int,), lambda v: isinstance(v, int) and not isinstance(v, bool), "int"),
    float: _scalar((int, float), lambda v: isinstance(v, int | float)
                   and not isinstance(v, bool), "float"),
    str: _scalar((str,), lambda v: isinstance(v, str), "str"),
    bool: _scalar((bool,), lambda v: False, "bool"),
    None: _scalar((_NONE_TYPE,), lambda v: False, "None"),
    _NONE_TYPE: _scalar((_NONE_TYPE,), lambda v: False, "None"),
    list: _scalar((list,), lambda v: isinstance(v, list), "list"),
    dict: _scalar((dict,), lambda v: isinstance(v, dict), "dict"),
}
_UNIONS = (Union, types.UnionType)


def compile_hint(hint: Any) -> Compiled | None:
    """The check for a value annotated ``hint``; None: not a JSON type, not checked."""
    try:
        scalar = _SCALARS.get(hint)
    except TypeError:  # an unhashable annotation: nothing we know
        return None
    if scalar is not None:
        return scalar
    origin = typing.get_origin(hint)
    form = _FORMS.get(Union if origin in _UNIONS else origin)
    return form(typing.get_args(hint)) if form is not None else None


def _union(members: tuple[Any, ...]) -> Compiled | None:
    compiled = [compile_hint(member) for member in members]
    if any(one is None for one in compiled):
        return None  # one member we cannot judge: the value may be that one
    known = [one for one in compiled if one is not None]
    checks = tuple(one.check for one in known)
    # Exact only when every member is: else a list or dict must be looked into.
    exact = (frozenset().union(*(one.exact for one in known if one.exact is not None))
             if all(one.exact is not None for one in known) else None)
    fast = exact or frozenset()
    return Compiled(lambda v: type(v) in fast or any(check(v) for check in checks),
                    " | ".join(one.shown for one in known), exact)


def _literal(values: tuple[Any, ...]) -> Compiled | None:
    if not all(v is None or type(v) in (int, float, str, bool) for v in values):
        return None  # an enum member: the application says how it travels
    # The type is compared too: Literal[1] does not take True, nor 1.0.
    allowed = frozenset((type(v), v) for v in values)
    return Compiled(lambda v: _hashable(v) and (type(v), v) in allowed,
                    f"Literal{list(values)!r}")


def _hashable(value: Any) -> bool:
    return isinstance(value, int | float | str | bool) or value is None


def _list(args: tuple[Any, ...]) -> Compiled:
    item = compile_hint(args[0]) if args else None
    if item is None:
        return _SCALARS[list]
    check, exact = item.check, item.exact or frozenset()
    return Compiled(lambda v: isinstance(v, list) and (exact.issuperset(map(type, v))
                                                       or all(map(check, v))),
                    f"list[{item.shown}]")


def _dict(args: tuple[Any, ...]) -> Compiled:
    value = compile_hint(args[1]) if len(args) == 2 else None
    if value is None:
        return _SCALARS[dict]  # keys are strings in JSON whatever the annotation says
    check, exact = value.check, value.exact or frozenset()
    return Compiled(lambda v: isinstance(v, dict) and (exact.issuperset(map(type, v.values()))
                                                       or all(map(check, v.values()))),
                    f"dict[str, {value.shown}]")


_FORMS: dict[Any, Callable[[tuple[Any, ...]], Compiled | None]] = {
    Union: _union, Literal: _literal, list: _list, dict: _dict,
}


class _Holder:
    """An object carrying one annotation, for ``typing.get_type_hints``."""

    def __init__(self, annotations: dict[str, Any]) -> None:
        self.__annotations__ = annotations


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations resolved (string ones evaluated in its module);
    a parameter whose annotation cannot be resolved is left out."""
    with contextlib.suppress(Exception):  # any failure to resolve: try one by one
        return typing.get_type_hints(fn)
    raw = getattr(fn, "__annotations__", None) or {}
    namespace = getattr(fn, "__globals__", {})
    hints: dict[str, Any] = {}
    for name, annotation in raw.items():
        try:
            hints.update(typing.get_type_hints(_Holder({name: annotation}), namespace))
        except Exception:  # noqa: BLE001, S112 - unresolvable: that parameter is not checked
            continue
    return hints

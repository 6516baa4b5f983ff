"""What one setting's declaration says, and what is derived from it.

A :class:`Setting` names a ``[wurk]`` key once: its type (as the
:class:`wurk.settings.config.Config` attribute writes it), default, range or
choices, help text, environment variables and ``wurk run`` flag. The table
of them is :mod:`wurk.settings.declared`.

Duties:
1. Turn a declared type into the Python types a value may have
   (:attr:`Setting.types`) and into the words the reference page shows.
2. Build each Config attribute's dataclass field from its declaration
   (:func:`config_fields`), and refuse at import a Config whose attributes
   and annotations are not exactly the table's.
3. Give each setting's documented default, range and flag as text for the
   generated reference page (:mod:`wurk.settings.reference`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from wurk.settings.bounds import Range

NONE = type(None)
# Each declared type, as a Config annotation writes it: (accepted Python types, words).
KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "str": ((str,), "string"),
    "str | None": ((str, NONE), "string"),
    "int": ((int,), "integer"),
    "int | None": ((int, NONE), "integer"),
    "float": ((int, float), "number"),
    "float | None": ((int, float, NONE), "number"),
    "bool": ((bool,), "boolean"),
    "list[str]": ((list,), "list of strings"),
}

# Stands for "declared in wurk.settings.declared" as a Config attribute's
# default; typed Any so mypy sees an attribute with a default of its type.
DECLARED: Any = object()

T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    """A ``wurk run`` option that sets the setting.

    ``help`` may say ``{default}`` or ``{choices}``; ``metavar`` defaults to
    the long option's name in capitals."""

    names: tuple[str, ...]
    help: str
    metavar: str | None = None


@dataclass(frozen=True)
class Setting:
    """One key of a ``[wurk]`` table, which the environment and ``wurk run``'s
    options may also set, as declared."""

    name: str
    annotation: str  # a key of KINDS, exactly as the Config attribute writes its type
    default: Any
    help: str
    range: Range | None = None
    choices: tuple[str, ...] = ()
    # The documented bound, where ``range`` alone does not say it (a port, a weight,
    # a bound that depends on another setting).
    limit: str = ""
    # The reference page's default, where the value alone does not tell it.
    shown_default: str = ""
    flag: Flag | None = None
    # Builds the default instead of copying ``default`` (which then is what the page shows).
    factory: Callable[[], Any] | None = None
    # Read from these variables too, before WURK_<NAME> (which wins).
    also_env: tuple[str, ...] = ()
    secret: bool = False  # kept out of repr(config)
    # False for a key only a file sets (the swarm parent's own keys).
    from_env: bool = True

    @property
    def types(self) -> tuple[type, ...]:
        return KINDS[self.annotation][0]

    @property
    def env(self) -> str:
        return f"WURK_{self.name.upper()}"

    def field(self) -> Any:
        if self.factory is not None:
            return dataclasses.field(default_factory=self.factory, repr=not self.secret)
        if isinstance(self.default, list):
            return dataclasses.field(default_factory=_copier(self.default), repr=not self.secret)
        return dataclasses.field(default=self.default, repr=not self.secret)

    # -- as the reference page shows it ------------------------------------
    def kind_text(self) -> str:
        return KINDS[self.annotation][1]

    def default_text(self) -> str:
        if self.shown_default:
            return self.shown_default
        value = self.default
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, str | list):
            return "`" + _toml(value) + "`"
        return _number(value)

    def range_text(self) -> str:
        if self.limit:
            return self.limit
        if self.range is not None:
            return self.range.describe()
        return ", ".join(f"`{choice}`" for choice in self.choices)

    def env_text(self) -> str:
        names = (self.env, *self.also_env) if self.from_env else ()
        return ", ".join(f"`{name}`" for name in names)

    def flag_text(self) -> str:
        return ", ".join(f"`{name}`" for name in self.flag.names) if self.flag else ""


@dataclass(frozen=True)
class Hook:
    """A setting that holds Python callables: set in code only, never from TOML
    or the environment, and kept out of repr(config)."""

    name: str
    annotation: str
    help: str
    many: bool  # a list of callables (default empty) rather than one (default None)

    def field(self) -> Any:
        if self.many:
            return dataclasses.field(default_factory=list, repr=False)
        return dataclasses.field(default=None, repr=False)


def config_fields(settings: Sequence[Setting], hooks: Sequence[Hook] = (), *,
                  own: Sequence[str] = ()) -> Callable[[type[T]], type[T]]:
    """A class decorator, applied under ``@dataclass``: each attribute set to
    :data:`DECLARED` gets its declaration's field. Besides the attributes named
    in ``own``, the class must annotate exactly the declared names, in order,
    with the declared types."""
    declared: dict[str, Setting | Hook] = {s.name: s for s in settings}
    declared |= {h.name: h for h in hooks}

    def decorate(cls: type[T]) -> type[T]:
        written = {n: a for n, a in cls.__annotations__.items() if n not in own}
        wanted = {name: d.annotation for name, d in declared.items()}
        if list(written.items()) != list(wanted.items()):
            differ = next(n for n in (*wanted, *written) if written.get(n) != wanted.get(n))
            raise TypeError(f"{cls.__name__}.{differ} is annotated {written.get(differ)!r} "
                            f"but declared {wanted.get(differ)!r}, or out of order")
        for name, declaration in declared.items():
            if vars(cls).get(name) is not DECLARED:
                raise TypeError(f"{cls.__name__}.{name} must be set to DECLARED")
            setattr(cls, name, declaration.field())
        return cls

    return decorate


def _copier(value: list[Any]) -> Callable[[], list[Any]]:
    return lambda: list(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _toml(value: str | list[Any]) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return "[" + ", ".join(_toml(v) for v in value) + "]"

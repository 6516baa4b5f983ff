"""One setting's value against its declaration, and the environment's values.

Duties:
1. :class:`ConfigError`, the one error every bad setting raises, its message
   naming the source, the key and the value (quoted through
   :func:`wurk.core.redaction.shown`, so no password shows).
2. :func:`check_type`: a value of a type its declaration
   (:mod:`wurk.settings.declared`) allows; finite, and a list of strings
   where a list is wanted.
3. :func:`environment_layer`: the declared variables of an environment
   (``WURK_<NAME>``, and ``REDIS_URL`` under ``WURK_REDIS_URL``), each coerced
   from its string to the declared type, with the variable it came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from wurk.core.redaction import shown
from wurk.settings.declared import BY_NAME, SETTINGS


class ConfigError(ValueError):
    """A setting is missing, unknown or has a bad value; the message says which."""


def check_type(name: str, value: Any, source: str) -> None:
    allowed = BY_NAME[name].types
    # bool is an int subclass; "concurrency = true" is a mistake, not 1.
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        wanted = " or ".join(t.__name__ for t in allowed)
        raise ConfigError(f"{source}: {name} must be {wanted}, got {shown(name, value)}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {name} must be a list of strings, got {shown(name, value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {name} must be a finite number, got {shown(name, value)}")


def environment_layer(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The default of each setting whose default is read from the environment
    (the Redis URL), its other variables over it (``REDIS_URL``), then
    ``WURK_*``: the values, and per key the source an error should name
    (``environment: WURK_TAG``)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.factory is not None:
            values[setting.name], sources[setting.name] = setting.default, "default"
        for var in setting.also_env:
            if env.get(var):
                values[setting.name], sources[setting.name] = env[var], f"environment: {var}"
    for name, value in from_wurk_env(env).items():
        values[name], sources[name] = value, f"environment: {BY_NAME[name].env}"
    return values, sources


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``REDIS_URL``, overridden by the ``WURK_<FIELD>`` variables."""
    values = {s.name: env[var] for s in SETTINGS for var in s.also_env if env.get(var)}
    return values | from_wurk_env(env)


def from_wurk_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``WURK_<FIELD>`` variables, coerced to each field's type."""
    return {s.name: coerce(s.name, env[s.env]) for s in SETTINGS if env.get(s.env) is not None}


def coerce(name: str, raw: str) -> Any:
    allowed = BY_NAME[name].types
    where = f"environment: {BY_NAME[name].env}"
    try:
        if bool in allowed:
            return _parse_bool(raw)
        if list in allowed:
            return [part.strip() for part in raw.split(",") if part.strip()]
        if int in allowed and float not in allowed:
            return int(raw)
        if float in allowed:
            number = float(raw)
            return int(number) if number.is_integer() and int in allowed else number
    except ValueError:
        wanted = " or ".join(t.__name__ for t in allowed if t is not type(None))
        raise ConfigError(f"{where} must be {wanted}, got {shown(name, raw)}") from None
    return raw


def _parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)

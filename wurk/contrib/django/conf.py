"""wurk's settings in a Django project: ``settings.WURK`` and ``settings.WURK_ON_COMMIT``.

Duties:
1. :func:`build_config`: a :class:`wurk.settings.config.Config` from the
   environment (``REDIS_URL``, ``WURK_*``), then ``settings.WURK`` over it,
   then the command line's flags; every value checked with wurk's own
   messages, naming ``settings.WURK`` as the source of a bad one.
2. :func:`values`: ``settings.WURK``'s settings without its hooks, for a
   swarm's topology to read under its ``[wurk]`` table.
3. :func:`hooks`: the hooks ``settings.WURK`` names (``error_handlers``,
   ``server_middleware``, ...), as callables or dotted paths to them.
4. :func:`add_hooks`: give a config those hooks, wurk's own middleware for
   Django (the database connections around each job, pushes deferred to the
   commit) and nothing twice. :mod:`.apps` registers it with
   ``wurk.settings.config.when_configured``, so every config a worker installs
   gets them, a swarm child's (installed after the fork) included.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from wurk.contrib.django import connections, transactions
from wurk.core.redaction import shown
from wurk.settings.config import Config, ConfigError
from wurk.settings.declared import HOOKS
from wurk.settings.values import environment_layer

SOURCE = "settings.WURK"
HOOK_NAMES = {hook.name: hook.many for hook in HOOKS}


def raw_settings() -> dict[str, Any]:
    raw = getattr(settings, "WURK", {})
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        raise ConfigError(f"{SOURCE} must be a dict of wurk settings, "
                          f"got {shown('WURK', raw, unknown=True)}")
    return dict(raw)


def values() -> dict[str, Any]:
    """``settings.WURK`` less its hooks (code-only settings)."""
    return {k: v for k, v in raw_settings().items() if k not in HOOK_NAMES}


def build_config(**overrides: Any) -> Config:
    """Environment < ``settings.WURK`` < ``overrides`` (None-valued ones ignored)."""
    merged, sources = environment_layer(os.environ)
    given = values()
    merged.update(given)
    sources.update(dict.fromkeys(given, SOURCE))
    flags = {k: v for k, v in overrides.items() if v is not None}
    merged.update(flags)
    sources.update(dict.fromkeys(flags, "arguments"))
    return Config.from_mapping(merged, source=SOURCE, sources=sources)


def hooks() -> dict[str, Any]:
    """Each hook ``settings.WURK`` sets: a list of callables, or one callable."""
    found: dict[str, Any] = {}
    for name, value in raw_settings().items():
        if name in HOOK_NAMES:
            found[name] = _hook(name, value, many=HOOK_NAMES[name])
    return found


def _hook(name: str, value: Any, *, many: bool) -> Any:
    if not many:
        return None if value is None else _callable(name, value)
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"{SOURCE}: {name} must be a list of callables or dotted paths, "
                          f"got {shown(name, value, unknown=True)}")
    return [_callable(name, item) for item in value]


def _callable(name: str, value: Any) -> Callable[..., Any]:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ConfigError(f"{SOURCE}: {name}: cannot import {value!r}: {exc}") from None
    if not callable(value):
        raise ConfigError(f"{SOURCE}: {name} must hold callables or dotted paths to them, "
                          f"got {shown(name, value, unknown=True)}")
    found: Callable[..., Any] = value
    return found


def on_commit_alias() -> tuple[bool, str]:
    """``WURK_ON_COMMIT``: True (the default) defers pushes made inside
    ``transaction.atomic`` on the default database to its commit, a database
    alias does so for that one, False pushes at once unless asked."""
    value = getattr(settings, "WURK_ON_COMMIT", True)
    if isinstance(value, bool):
        return value, DEFAULT_DB_ALIAS
    if isinstance(value, str) and value in settings.DATABASES:
        return True, value
    raise ConfigError(f"settings.WURK_ON_COMMIT must be true, false or a database alias "
                      f"({', '.join(sorted(settings.DATABASES))}), got {value!r}")


def add_hooks(config: Config) -> Config | None:
    """Give ``config`` settings.WURK's hooks and Django's middleware, each once.

    The hook lists grow in place; a single hook the config lacks (Config is
    frozen) comes back in a copy for ``configure`` to install instead.
    """
    automatic, alias = on_commit_alias()
    given = hooks()
    singles = {}
    for name, value in given.items():
        if HOOK_NAMES[name]:
            _extend(getattr(config, name), value)
        elif getattr(config, name) is None:
            singles[name] = value
    # Outermost, so a push deferred to the commit runs the rest of the chain once.
    deferring = transactions.OnCommit(alias, automatic=automatic)
    if deferring not in config.client_middleware:
        config.client_middleware.insert(0, deferring)
    _extend(config.server_middleware, [connections.fresh_connections])
    return dataclasses.replace(config, **singles) if singles else None


def _extend(chain: list[Any], items: list[Any]) -> None:
    for item in items:
        if item not in chain:
            chain.append(item)

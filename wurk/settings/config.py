"""Configuration: one object built from defaults, a TOML file, the environment
and keyword arguments, in that order of precedence (later wins).

Duties:
1. Hold every setting the runtime reads, with Sidekiq's defaults; each is
   declared once in :mod:`wurk.settings.declared` (type, default, range,
   help, variable, flag), and the class must match that table exactly.
2. Load the ``[wurk]`` table of a TOML file over ``REDIS_URL`` / ``WURK_*``
   environment variables (coerced by :mod:`wurk.settings.values`).
3. Validate, raising :class:`ConfigError` that names the source, the key and
   the bad value (every number within its declared range, the Redis URL whole
   by :mod:`wurk.settings.redis_url`); a value that may hold a password is
   quoted through :mod:`wurk.core.redaction`, as is ``repr(config)``.
4. Hold the process-wide default config (``configure``, ``default_config``),
   and tell the integrations that registered with ``when_configured`` of
   each one installed, so they can add their hooks to it.

A Config holds values only and is frozen: a changed setting is a new Config
(``dataclasses.replace``), so whatever was built from one (its runtime, its
pools, a launcher) never sees a value change under it. Its live state (Redis
pools, clock) is the process's :class:`wurk.redis.runtime.Runtime` for it.
The hook chains (``error_handlers``, ``server_middleware`` ...) are lists
that an integration may extend in place when the config is installed.

Hooks (error, death, Redis error handlers and server middleware) are Python
callables and so are set in code, never from TOML.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wurk.core.redaction import shown
from wurk.core.suggest import did_you_mean
from wurk.settings.checks import problems
from wurk.settings.declaration import DECLARED, config_fields
from wurk.settings.declared import BY_NAME, DEFAULT_REDIS_URL, HOOKS, SETTINGS
from wurk.settings.files import SettingsFileError, read_settings_file
from wurk.settings.hooks import (
    ClientMiddleware,
    DeathHandler,
    ErrorHandler,
    RedisErrorHook,
    ServerMiddleware,
    ShutdownHook,
)
from wurk.settings.queues import QueueSpecError, parse_queues
from wurk.settings.values import ConfigError, check_type, environment_layer

# Names other modules import from here, some defined elsewhere in the package.
__all__ = ["DEFAULT_REDIS_URL", "Config", "ConfigError", "configure", "default_config",
           "environment_layer", "installed_for", "read_toml_table", "settable_fields",
           "validate", "when_configured", "when_default_replaced"]


@dataclass(repr=False, frozen=True)
@config_fields(SETTINGS, HOOKS)
class Config:
    """Every setting's value; types, defaults and help are in :mod:`wurk.settings.declared`."""

    redis_url: str = DECLARED
    sentinels: list[str] = DECLARED
    sentinel_master: str | None = DECLARED
    sentinel_password: str | None = DECLARED
    concurrency: int = DECLARED
    executor: str = DECLARED
    executor_threads: int | None = DECLARED
    queues: list[str] = DECLARED
    require: list[str] = DECLARED
    shutdown_timeout: float = DECLARED
    max_jobs: int | None = DECLARED
    max_jobs_jitter: int | None = DECLARED
    tag: str = DECLARED
    labels: list[str] = DECLARED
    timestamps: str = DECLARED
    max_retries: int = DECLARED
    dead_max_jobs: int = DECLARED
    dead_timeout: float = DECLARED
    batch_linger: int = DECLARED
    average_scheduled_poll_interval: float = DECLARED
    poll_interval_average: float | None = DECLARED
    heartbeat_interval: float = DECLARED
    fetch_timeout: float = DECLARED
    reliable_fetch: bool = DECLARED
    reliable_poll_interval: float = DECLARED
    reliable_push: bool = DECLARED
    push_buffer_size: int = DECLARED
    push_flush_timeout: float = DECLARED
    push_replicas: int | None = DECLARED
    push_replicas_timeout: float = DECLARED
    spool_dir: str | None = DECLARED
    spool_interval: float = DECLARED
    reliable_scheduler: bool = DECLARED
    reaper_interval: float = DECLARED
    max_recoveries: int = DECLARED
    redis_pool_size: int | None = DECLARED
    redis_connect_timeout: float = DECLARED
    redis_read_timeout: float = DECLARED
    redis_retry_attempts: int = DECLARED
    redis_retry_base: float = DECLARED
    redis_retry_cap: float = DECLARED
    log_level: str = DECLARED
    log_format: str = DECLARED
    profile_ttl: int = DECLARED
    metrics_url: str | None = DECLARED
    metrics_dogstatsd: bool = DECLARED
    metrics_prometheus: bool = DECLARED
    class_metrics: bool = DECLARED
    class_metrics_format: str = DECLARED
    health_listen: str | None = DECLARED
    web_user: str | None = DECLARED
    web_password: str | None = DECLARED
    web_allowed_hosts: list[str] = DECLARED

    error_handlers: list[ErrorHandler] = DECLARED
    death_handlers: list[DeathHandler] = DECLARED
    server_middleware: list[ServerMiddleware] = DECLARED
    client_middleware: list[ClientMiddleware] = DECLARED
    on_shutdown: list[ShutdownHook] = DECLARED
    on_redis_error: RedisErrorHook | None = DECLARED

    def __post_init__(self) -> None:
        validate(self, source="arguments")

    # -- building ---------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        """Each layer overrides the ones before it: defaults, ``REDIS_URL``,
        ``WURK_*`` variables, the TOML file's ``[wurk]`` table, then ``overrides``
        (the command line). An error names the layer that gave the bad value."""
        values, sources = environment_layer(os.environ if env is None else env)
        layers = [
            (read_toml_table(Path(path)) if path is not None else {}, str(path)),
            ({k: v for k, v in overrides.items() if v is not None}, "arguments"),
        ]
        for layer, where in layers:
            values.update(layer)
            sources.update(dict.fromkeys(layer, where))
        return cls.from_mapping(values, source="arguments", sources=sources)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, source: str,
                     sources: Mapping[str, str] | None = None,
                     known: Iterable[str] = ()) -> Config:
        """``sources`` may name, per key, a source other than ``source`` for errors;
        ``known``: keys the caller reads itself (the swarm's), which an unknown
        key's "did you mean" may name too."""
        where = dict(sources or {})
        unknown = sorted(set(values) - settable_fields())
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{where.get(key, source)}: unknown key {key!r} "
                              f"(set to {shown(key, values[key], unknown=True)})"
                              f"{did_you_mean(key, settable_fields() | set(known))}")
        for name, value in values.items():
            check_type(name, value, where.get(name, source))
        config = cls.__new__(cls)
        # Not cls(): that would validate the defaults (REDIS_URL included)
        # and blame "arguments" for a value that came from the environment.
        # object.__setattr__: the one place a frozen Config is filled in.
        for f in dataclasses.fields(cls):
            object.__setattr__(config, f.name,
                               values[f.name] if f.name in values else _field_default(f))
        validate(config, source=source, sources=where)
        return config

    def __repr__(self) -> str:
        # Hand-written so the URLs' passwords stay out of logs and tracebacks.
        fields = ", ".join(f"{f.name}={shown(f.name, getattr(self, f.name))}"
                           for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__name__}({fields})"

    # -- derived ----------------------------------------------------------
    @property
    def pool_size(self) -> int:
        # Every processor thread may hold a connection, plus the heartbeat,
        # the scheduler, the cancel watch and the application's own pushes.
        if self.redis_pool_size:
            return self.redis_pool_size
        if self.executor == "asyncio":
            # Its threads instead: feeders, bookkeeping, sync jobs (wurk.runtime.aio_manager).
            return asyncio_threads(self.concurrency, self.executor_threads) + 6
        return self.concurrency + 6

    @property
    def replicas_to_confirm(self) -> int:
        """How many replicas must confirm each push (see ``push_replicas``)."""
        if self.push_replicas is not None:
            return self.push_replicas
        return 1 if self.sentinels else 0


def _field_default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def settable_fields() -> set[str]:
    """Fields a file or the environment may set; hooks are code-only."""
    return set(BY_NAME)


def validate(config: Config, *, source: str, sources: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError naming the first bad setting; None-valued optionals pass.

    ``sources`` maps a key to where its value came from when that is not ``source``.
    """
    where = sources or {}
    for key, why in problems(config):
        raise ConfigError(f"{where.get(key, source)}: {key} {why}, "
                          f"got {shown(key, getattr(config, key))}")
    try:
        parse_queues(config.queues)
    except QueueSpecError as exc:
        raise ConfigError(f"{where.get('queues', source)}: queues {exc}") from None


def read_toml_table(path: Path) -> dict[str, Any]:
    """The ``[wurk]`` table of a TOML file (a file with no such table gives {})."""
    try:
        document = tomllib.loads(read_settings_file(path))
    except SettingsFileError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    table = document.get("wurk", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: wurk must be a table, got {shown('wurk', table, unknown=True)}")
    return dict(table)


_default: Config | None = None
# What configure() was last given, then each callback's copy of it: the last is the default.
_lineage: list[Config] = []
# Told of a default config that configure() replaced (the pools close its pool).
_on_replaced: list[Callable[[Config], None]] = []
# Told of each default config installed (integrations add their middleware).
_on_configured: list[Callable[[Config], Config | None]] = []


def when_default_replaced(callback: Callable[[Config], None]) -> None:
    """Call ``callback(old)`` whenever ``configure`` replaces the default config."""
    _on_replaced.append(callback)


def when_configured(callback: Callable[[Config], Config | None]) -> None:
    """Call ``callback(config)`` on the default config now, if one is installed,
    and on every default installed later (by ``configure`` or the first
    ``default_config()``).

    This is how an integration (``wurk.contrib``) gives its hooks to every
    worker: ``wurk run`` and each swarm child install their config with
    ``configure`` after the application is loaded (a child after the fork),
    and the callback adds the integration's middleware to it. A callback
    must be idempotent: it may see one config more than once. It extends
    the config's hook lists in place, or returns a changed copy
    (``dataclasses.replace``) to install instead, for a field it cannot
    extend (a single hook such as ``on_redis_error``).
    """
    global _default  # noqa: PLW0603 - the one documented default instance
    _on_configured.append(callback)
    if _default is not None:
        _default = _replaced_by(_default, callback(_default))


def default_config() -> Config:
    """The process-wide config that ``@wurk.job`` helpers and ``Client()`` use."""
    global _default, _lineage  # noqa: PLW0603 - the one documented default instance
    if _default is None:
        _default = Config.load()
        _lineage = [_default]
        _default = _installed(_default)
    return _default


def configure(config: Config | None = None, **overrides: Any) -> Config:
    """Install the process-wide default config (built from overrides if not given).

    Returns the config installed: ``config`` itself, or the copy an
    integration's ``when_configured`` callback made of it; use that one.
    """
    global _default, _lineage  # noqa: PLW0603 - the one documented default instance
    old, _default = _default, config if config is not None else Config.load(**overrides)
    _lineage = [_default]
    if old is not None and old is not _default:
        for callback in _on_replaced:
            callback(old)
    _default = _installed(_default)
    return _default


def installed_for(config: Config) -> Config:
    """The default installed in place of ``config``, else ``config`` itself.

    An entry point installs its config, then loads the application's modules;
    one of those may register a ``when_configured`` callback whose copy then
    becomes the default (``wurk.contrib.django.boot`` under ``wurk run``). The
    entry point runs that copy, not the config it holds. A module that
    installed a config of its own (``configure(other)``) does not count.
    """
    return _default if _default is not None and any(one is config for one in _lineage) \
        else config


def _installed(config: Config) -> Config:
    """The default after every ``when_configured`` callback saw ``config``."""
    for callback in list(_on_configured):
        config = _replaced_by(config, callback(config))
    return config


def _replaced_by(config: Config, copy: Config | None) -> Config:
    """``copy`` (a callback's) in place of ``config``, whose pool closes."""
    if copy is None or copy is config:
        return config
    for callback in _on_replaced:
        callback(config)
    _lineage.append(copy)
    return copy


# The asyncio executor's threads (wurk.runtime.aio_manager, aio_processor).
ASYNCIO_FEEDERS = 64
ASYNCIO_BOOKKEEPING = 8
ASYNCIO_SYNC_THREADS = 16


def sync_threads(concurrency: int, executor_threads: int | None) -> int:
    """The asyncio executor's pool for sync jobs: ``executor_threads``, or derived."""
    return executor_threads or min(concurrency, ASYNCIO_SYNC_THREADS)


def asyncio_threads(concurrency: int, executor_threads: int | None) -> int:
    """Threads of the asyncio executor that may each hold a Redis connection."""
    return (min(concurrency, ASYNCIO_FEEDERS) + min(concurrency, ASYNCIO_BOOKKEEPING)
            + sync_threads(concurrency, executor_threads))

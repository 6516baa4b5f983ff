"""Configuration: one object built from defaults, a TOML file, the environment
and keyword arguments, in that order of precedence (later wins).

Duties:
1. Hold every setting the runtime reads, with Sidekiq's defaults.
2. Load the ``[wurk]`` table of a TOML file and ``REDIS_URL`` / ``WURK_*``
   environment variables, coercing strings to the field's type.
3. Validate, raising :class:`ConfigError` that names the source, the key and
   the bad value (every number within its range in :mod:`wurk.settings.limits`, the
   Redis URL whole by :mod:`wurk.settings.redis_url`); a value that may hold a
   password is quoted through :mod:`wurk.core.redaction`, as is ``repr(config)``.
4. Hold the process-wide default config (``configure``, ``default_config``).

A Config holds values only: its Redis pool comes from
:func:`wurk.redis.pools.pool_for`.

Hooks (error, death, Redis error handlers and server middleware) are Python
callables and so are set in code, never from TOML.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool

from wurk.core.redaction import shown
from wurk.settings.checks import problems
from wurk.settings.hooks import DeathHandler, ErrorHandler, RedisErrorHook, ServerMiddleware
from wurk.settings.queues import QueueSpecError, parse_queues

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


class ConfigError(ValueError):
    """A setting is missing, unknown or has a bad value; the message says which."""


@dataclass(repr=False)
class Config:
    redis_url: str = field(default_factory=lambda: os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    # Redis Sentinel: "host:port" of each sentinel and the master's name. The
    # URL then only gives the db number, username and password.
    sentinels: list[str] = field(default_factory=list)
    sentinel_master: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    concurrency: int = 10
    queues: list[str] = field(default_factory=lambda: ["default"])
    require: list[str] = field(default_factory=list)
    shutdown_timeout: float = 25.0
    tag: str = ""
    labels: list[str] = field(default_factory=list)
    # "float" writes epoch seconds with a fraction (every Sidekiq 6.4-8.1
    # reads it); "ms" writes Sidekiq 8's integer milliseconds.
    timestamps: str = "float"
    max_retries: int = 25
    dead_max_jobs: int = 10_000
    dead_timeout: float = 180 * 24 * 3600.0
    # Scheduler: the whole cluster polls about once per this many seconds.
    average_scheduled_poll_interval: float = 5.0
    # When set, every process polls about this often and skips the initial wait.
    poll_interval_average: float | None = None
    heartbeat_interval: float = 5.0
    fetch_timeout: float = 2.0
    # Reliable fetch keeps each claimed job in a private list until it is
    # acknowledged, so a killed process loses nothing.
    reliable_fetch: bool = True
    # With several queues, how long an idle fetcher blocks on the first one
    # before looking at the others again.
    reliable_poll_interval: float = 0.25
    # Pushes that cannot reach Redis (it is down) wait in memory, in order,
    # up to push_buffer_size jobs, and are sent when it returns.
    reliable_push: bool = True
    push_buffer_size: int = 10_000
    # At exit, how long a process tries to send what is still buffered.
    push_flush_timeout: float = 5.0
    # When above 0, a push counts only once this many replicas confirm it
    # (WAIT), waiting up to push_replicas_timeout seconds per try; closes the
    # window in which a failover drops a push the primary had accepted.
    # Unset means 1 with Sentinel (there is a replica to fail over to) and 0
    # without.
    push_replicas: int | None = None
    push_replicas_timeout: float = 1.0
    # Where a process leaves, at exit, the pushes it could not send (see
    # wurk.push.spool); unset: $XDG_STATE_HOME/wurk/spool or ~/.local/state/wurk/spool.
    spool_dir: str | None = None
    # How often wurk run and swarm children push what the spool holds.
    spool_interval: float = 10.0
    # Move due scheduled/retry jobs inside one Lua script (no pop-then-push
    # window); false keeps Sidekiq's classic pop-one-then-push poller.
    reliable_scheduler: bool = True
    # How often a process looks for dead processes' private lists.
    reaper_interval: float = 60.0
    # A job recovered from dead processes more often than this is a poison pill.
    max_recoveries: int = 3
    redis_pool_size: int | None = None
    redis_connect_timeout: float = 1.0
    redis_read_timeout: float = 2.5
    redis_retry_attempts: int = 4
    redis_retry_base: float = 0.5
    redis_retry_cap: float = 4.0
    log_level: str = "info"
    log_format: str = "auto"
    # Observability (wurk.observe.profiler and .metrics, wurk.runtime.health);
    # all off by default.
    # How long a job's profile stays in Redis, in seconds (Sidekiq 8: one day).
    profile_ttl: int = 86_400
    # "udp://host:port" of a statsd (or DogStatsD) agent; None sends nothing.
    metrics_url: str | None = None
    # Send tags DogStatsD's way (``|#k:v``) instead of folding them into names.
    metrics_dogstatsd: bool = False
    # Keep in-process totals and serve them as Prometheus text on GET /metrics
    # of the health listener (needs health_listen).
    metrics_prometheus: bool = False
    # "host:port" for the HTTP health listener (/live, /ready); None: no listener.
    # A bare ":port" or "port" binds 127.0.0.1; port 0 picks a free port. Swarm
    # children add their index to a non-zero port.
    health_listen: str | None = None

    error_handlers: list[ErrorHandler] = field(default_factory=list, repr=False)
    death_handlers: list[DeathHandler] = field(default_factory=list, repr=False)
    server_middleware: list[ServerMiddleware] = field(default_factory=list, repr=False)
    on_redis_error: RedisErrorHook | None = field(default=None, repr=False)

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
                     sources: Mapping[str, str] | None = None) -> Config:
        """``sources`` may name, per key, a source other than ``source`` for errors."""
        where = dict(sources or {})
        unknown = sorted(set(values) - settable_fields())
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{where.get(key, source)}: unknown key {key!r} "
                              f"(set to {shown(key, values[key], unknown=True)})")
        for name, value in values.items():
            check_type(name, value, where.get(name, source))
        config = cls.__new__(cls)
        # Not cls(): that would validate the defaults (REDIS_URL included)
        # and blame "arguments" for a value that came from the environment.
        for f in dataclasses.fields(cls):
            setattr(config, f.name, values[f.name] if f.name in values else _field_default(f))
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
        # the scheduler and the application's own pushes.
        return self.redis_pool_size or self.concurrency + 5

    @property
    def replicas_to_confirm(self) -> int:
        """How many replicas must confirm each push (see ``push_replicas``)."""
        if self.push_replicas is not None:
            return self.push_replicas
        return 1 if self.sentinels else 0

    # -- deprecated: pools live in wurk.redis.pools -----------------------
    @property
    def pool(self) -> RedisPool:
        """Deprecated: use ``wurk.redis.pools.pool_for(config)``."""
        from wurk.redis.pools import pool_for  # noqa: PLC0415 - a shim, gone next release

        warnings.warn("Config.pool is deprecated; use wurk.redis.pools.pool_for(config)",
                      DeprecationWarning, stacklevel=2)
        return pool_for(self)

    def reset_pool(self) -> None:
        """Deprecated: use ``wurk.redis.pools.close_pool(config)``."""
        from wurk.redis.pools import close_pool  # noqa: PLC0415 - a shim, gone next release

        warnings.warn("Config.reset_pool() is deprecated; use wurk.redis.pools.close_pool(config)",
                      DeprecationWarning, stacklevel=2)
        close_pool(self)


def _field_default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# Fields a file or the environment may set; hooks are code-only.
_CODE_ONLY = {"error_handlers", "death_handlers", "server_middleware", "on_redis_error"}


def settable_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(Config)} - _CODE_ONLY


_TYPES: dict[str, tuple[type, ...]] = {
    "redis_url": (str,),
    "sentinels": (list,),
    "sentinel_master": (str, type(None)),
    "sentinel_password": (str, type(None)),
    "concurrency": (int,),
    "queues": (list,),
    "require": (list,),
    "shutdown_timeout": (int, float),
    "tag": (str,),
    "labels": (list,),
    "timestamps": (str,),
    "max_retries": (int,),
    "dead_max_jobs": (int,),
    "dead_timeout": (int, float),
    "average_scheduled_poll_interval": (int, float),
    "poll_interval_average": (int, float, type(None)),
    "heartbeat_interval": (int, float),
    "fetch_timeout": (int, float),
    "reliable_fetch": (bool,),
    "reliable_poll_interval": (int, float),
    "reliable_scheduler": (bool,),
    "reliable_push": (bool,),
    "push_buffer_size": (int,),
    "push_flush_timeout": (int, float),
    "push_replicas": (int, type(None)),
    "push_replicas_timeout": (int, float),
    "spool_dir": (str, type(None)),
    "spool_interval": (int, float),
    "reaper_interval": (int, float),
    "max_recoveries": (int,),
    "redis_pool_size": (int, type(None)),
    "redis_connect_timeout": (int, float),
    "redis_read_timeout": (int, float),
    "redis_retry_attempts": (int,),
    "redis_retry_base": (int, float),
    "redis_retry_cap": (int, float),
    "log_level": (str,),
    "log_format": (str,),
    "profile_ttl": (int,),
    "metrics_url": (str, type(None)),
    "metrics_dogstatsd": (bool,),
    "metrics_prometheus": (bool,),
    "health_listen": (str, type(None)),
}


def check_type(name: str, value: Any, source: str) -> None:
    allowed = _TYPES[name]
    # bool is an int subclass; "concurrency = true" is a mistake, not 1.
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        wanted = " or ".join(t.__name__ for t in allowed)
        raise ConfigError(f"{source}: {name} must be {wanted}, got {shown(name, value)}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {name} must be a list of strings, got {shown(name, value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {name} must be a finite number, got {shown(name, value)}")


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
        with path.open("rb") as fh:
            document = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    table = document.get("wurk", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: wurk must be a table, got {shown('wurk', table, unknown=True)}")
    return dict(table)


def environment_layer(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The default Redis URL, ``REDIS_URL`` over it, then ``WURK_*``: the values,
    and per key the source an error should name (``environment: WURK_TAG``)."""
    values: dict[str, Any] = {"redis_url": DEFAULT_REDIS_URL}
    sources = {"redis_url": "default"}
    if env.get("REDIS_URL"):
        values["redis_url"] = env["REDIS_URL"]
        sources["redis_url"] = "environment: REDIS_URL"
    for name, value in from_wurk_env(env).items():
        values[name] = value
        sources[name] = f"environment: WURK_{name.upper()}"
    return values, sources


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``REDIS_URL``, overridden by the ``WURK_<FIELD>`` variables."""
    values: dict[str, Any] = {"redis_url": env["REDIS_URL"]} if env.get("REDIS_URL") else {}
    return values | from_wurk_env(env)


def from_wurk_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``WURK_<FIELD>`` variables, coerced to each field's type."""
    values: dict[str, Any] = {}
    for name in settable_fields():
        raw = env.get(f"WURK_{name.upper()}")
        if raw is not None:
            values[name] = coerce(name, raw)
    return values


def coerce(name: str, raw: str) -> Any:
    allowed = _TYPES[name]
    where = f"environment: WURK_{name.upper()}"
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


_default: Config | None = None
# Told of a default config that configure() replaced (the pools close its pool).
_on_replaced: list[Callable[[Config], None]] = []


def when_default_replaced(callback: Callable[[Config], None]) -> None:
    """Call ``callback(old)`` whenever ``configure`` replaces the default config."""
    _on_replaced.append(callback)


def default_config() -> Config:
    """The process-wide config that ``@wurk.job`` helpers and ``Client()`` use."""
    global _default  # noqa: PLW0603 - the one documented default instance
    if _default is None:
        _default = Config.load()
    return _default


def configure(config: Config | None = None, **overrides: Any) -> Config:
    """Install the process-wide default config (built from overrides if not given)."""
    global _default
    old, _default = _default, config if config is not None else Config.load(**overrides)
    if old is not None and old is not _default:
        for callback in _on_replaced:
            callback(old)
    return _default

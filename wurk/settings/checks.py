"""Checks of a whole :class:`wurk.settings.config.Config` beyond each value's type.

Duties:
1. :func:`problems`: every setting whose value cannot be used, as (key,
   reason) pairs: a choice outside its list or a number outside its range
   (both declared in :mod:`wurk.settings.declared`), a Redis URL that does
   not parse whole (:mod:`wurk.settings.redis_url`), Sentinel settings that
   do not fit together, a metrics URL or health address that does not parse,
   an allowed-hosts entry that is not a host (:mod:`wurk.settings.hosts`).
2. Quote no value unredacted: the caller quotes the setting through
   :func:`wurk.core.redaction.shown`, so reasons cannot carry a password.
"""

from __future__ import annotations

from typing import Any, Protocol

from wurk.core.redaction import redact_url
from wurk.settings.addresses import parse_listen, parse_metrics_url
from wurk.settings.declared import RANGES, SETTINGS
from wurk.settings.hosts import parse_pattern
from wurk.settings.redis_url import MAX_PORT, RedisUrlError, parse_redis_url


class Settings(Protocol):
    """What these checks read of a Config by attribute (the declared ranges
    and choices are read by name); read-only, as a frozen Config's fields are."""

    @property
    def queues(self) -> list[str]: ...
    @property
    def sentinels(self) -> list[str]: ...
    @property
    def sentinel_master(self) -> str | None: ...
    @property
    def redis_url(self) -> str: ...
    @property
    def metrics_url(self) -> str | None: ...
    @property
    def health_listen(self) -> str | None: ...
    @property
    def metrics_prometheus(self) -> bool: ...
    @property
    def web_allowed_hosts(self) -> list[str]: ...


def problems(config: Settings) -> list[tuple[str, str]]:
    def value(key: str) -> Any:
        return getattr(config, key)

    found = [(s.name, f"must be one of {', '.join(s.choices)}") for s in SETTINGS
             if s.choices and str(value(s.name)).lower() not in s.choices]
    found += [(key, f"must be from {bounds.describe()}") for key, bounds in RANGES.items()
              if value(key) is not None and value(key) not in bounds]
    if not config.queues:
        found.append(("queues", "must name at least one queue"))
    if bool(config.sentinels) != bool(config.sentinel_master):
        found.append(("sentinel_master", "must be set exactly when sentinels are"))
    bad_address = next((a for a in config.sentinels if not _is_host_port(a)), None)
    if bad_address is not None:
        found.append(("sentinels", f"must be host:port entries with a port from 1 to "
                                   f"{MAX_PORT} ({redact_url(bad_address)!r} is not)"))
    try:
        parse_redis_url(config.redis_url, host_required=not config.sentinels)
    except RedisUrlError as exc:
        found.append(("redis_url", str(exc)))
    return found + _observability_problems(config)


def _observability_problems(config: Settings) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    try:
        if config.metrics_url is not None:
            parse_metrics_url(config.metrics_url)
    except ValueError as exc:
        found.append(("metrics_url", str(exc)))
    try:
        if config.health_listen is not None:
            parse_listen(config.health_listen)
    except ValueError as exc:
        found.append(("health_listen", str(exc)))
    if config.metrics_prometheus and config.health_listen is None:
        found.append(("metrics_prometheus", "needs health_listen (it is served there)"))
    for entry in config.web_allowed_hosts:
        try:
            parse_pattern(entry)
        except ValueError as exc:
            found.append(("web_allowed_hosts", f"{exc} ({entry!r} is not)"))
            break
    return found


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    # A host with "@" or "/" is a URL's userinfo or path: redis-py would quote it in errors.
    plain_host = bool(host) and not any(c in host for c in "@/ \t\0")
    return plain_host and port.isascii() and port.isdigit() and 1 <= int(port) <= MAX_PORT

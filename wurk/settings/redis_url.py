"""The Redis URL, checked whole before anything dials.

redis-py parses ``redis_url`` leniently: a db of ``abc`` silently means 0,
``/1/2`` means db 12, a port of 0 is dropped, a port of 99999 raises from
deep inside the first connection, and an unknown query option only fails
when a connection is built. wurk checks the URL at config time instead.

Duties:
1. :func:`parse_redis_url`: accept ``redis://``, ``rediss://`` (TLS) and
   ``unix://`` URLs with a host (unless Sentinel names it), a port from 1
   to 65535, a db that is a non-negative integer (in the path or ``?db=``),
   a socket path for ``unix://``, and only the query options wurk passes
   on; return a :class:`RedisAddress`.
2. Raise :class:`RedisUrlError` saying what is wrong. Its message never
   quotes the URL or any part of its userinfo or query values, so it cannot
   carry a password; callers quote the URL through
   :func:`wurk.core.redaction.redact_url`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

SCHEMES = ("redis", "rediss", "unix")
MAX_DB = 2**31 - 1  # Redis keeps its database count in a C int
MAX_PORT = 65535
# Query options passed on to redis-py's connections. Others are refused:
# they would fail only when a connection is built, or (retry_*,
# health_check_interval) undo what the pool relies on. ``protocol`` may only
# say 2: the pool speaks RESP2, whose reply shapes the code reads.
_OPTIONS = frozenset({"db", "username", "password", "client_name", "socket_timeout",
                      "socket_connect_timeout", "socket_keepalive", "protocol"})
_TLS_OPTIONS = frozenset({"ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs",
                          "ssl_ca_path", "ssl_ca_data", "ssl_check_hostname", "ssl_password",
                          "ssl_ciphers", "ssl_min_version"})


class RedisUrlError(ValueError):
    """The URL cannot be used; the message says why without quoting it."""


@dataclass(frozen=True)
class RedisAddress:
    scheme: str
    host: str | None
    port: int | None
    path: str | None  # the socket of a unix:// URL
    db: int

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"


def parse_redis_url(url: str, *, host_required: bool = True) -> RedisAddress:
    """Check ``url`` whole; ``host_required=False`` when Sentinel supplies the host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise RedisUrlError("is not a valid URL") from None
    try:
        port = parts.port
    except ValueError:
        raise RedisUrlError(f"must have a port from 1 to {MAX_PORT}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or not url.lower().startswith(f"{scheme}://"):
        raise RedisUrlError("must start with redis://, rediss:// or unix://")
    options = _options(parts, scheme)
    db = _db(parts, options, scheme)
    if scheme == "unix":
        return RedisAddress(scheme, None, None, _socket_path(parts), db)
    if port is not None and not 1 <= port <= MAX_PORT:
        raise RedisUrlError(f"must have a port from 1 to {MAX_PORT}")
    if host_required and not parts.hostname:
        raise RedisUrlError(f"must name a host, as {scheme}://HOST:PORT/DB")
    return RedisAddress(scheme, parts.hostname, port, None, db)


def _options(parts: SplitResult, scheme: str) -> dict[str, str]:
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise RedisUrlError("has a malformed query string") from None
    allowed = _OPTIONS | (_TLS_OPTIONS if scheme == "rediss" else frozenset())
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise RedisUrlError(f"has an unsupported option {unknown[0]!r} "
                            f"(supported: {', '.join(sorted(allowed))})")
    repeated = sorted(name for name, values in query.items() if len(values) > 1)
    if repeated:
        raise RedisUrlError(f"gives option {repeated[0]!r} more than once")
    options = {name: values[0] for name, values in query.items()}
    if options.get("protocol", "2") != "2":
        raise RedisUrlError("may only ask for protocol=2 (wurk speaks RESP2)")
    return options


def _db(parts: SplitResult, options: dict[str, str], scheme: str) -> int:
    # For unix:// the path is the socket, so only ?db= can name the database.
    path_db = "" if scheme == "unix" else unquote(parts.path).removeprefix("/")
    if path_db and "db" in options:
        raise RedisUrlError("names its db twice (in the path and in ?db=)")
    raw = options.get("db", path_db)
    if raw == "":
        return 0
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_DB:
        raise RedisUrlError(f"must have a db that is a non-negative integer (at most {MAX_DB})")
    return int(raw)


def _socket_path(parts: SplitResult) -> str:
    if parts.hostname or parts.port is not None:
        raise RedisUrlError("must give a socket path as unix:///path/to/redis.sock "
                            "(no host)")
    path = unquote(parts.path)
    if not path or path == "/" or "\0" in path:
        raise RedisUrlError("must give a socket path, as unix:///path/to/redis.sock")
    return path

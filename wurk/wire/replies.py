"""Reading Redis for the admin API and the features' APIs: config, decoding
and cursor scans.

It sits below ``wurk.api`` so that a feature package's API
(``wurk.batches.api``) builds on it without importing the ``wurk.api``
package, whose face hands that feature's names on: a loop through the face.

Duties:
1. Resolve the optional ``config`` every API entry point takes to the
   process default (``wurk.default_config()``).
2. Turn the pool's replies into text and numbers, in RESP2 or RESP3 shape,
   tolerating the missing and malformed values a crashed or foreign writer
   leaves behind.
3. Walk SSCAN/ZSCAN cursors inside one pool block. They are pure reads, so
   the block is declared idempotent and survives a connection blip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wurk.settings.config import Config, default_config
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.redis.pool import RedisPool

SCAN_COUNT = 100
# Escaped in a search: only "*" (any run) and "?" (any one character) are wildcards.
_GLOB_SPECIAL = "\\[]"


def resolve(config: Config | None) -> Config:
    return config if config is not None else default_config()


def text(value: Any) -> str:
    """A reply as text; None becomes ""."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def opt_text(value: Any) -> str | None:
    return None if value is None else text(value)


def to_int(value: Any, default: int = 0) -> int:
    try:
        return int(float(text(value))) if value is not None else default
    except (ValueError, OverflowError):  # "nan" / "inf" read from Redis
        return default


def to_float(value: Any, default: float = 0.0) -> float:
    try:
        return float(text(value)) if value is not None else default
    except ValueError:
        return default


def score_pairs(reply: Any) -> list[tuple[bytes, float]]:
    """(member, score) from a WITHSCORES or ZSCAN reply in either protocol.

    RESP2 sends a flat [member, score, ...] list of strings; RESP3 (redis-py
    8's default) sends [member, score] pairs with scores as doubles.
    """
    if reply and isinstance(reply[0], list | tuple):
        return [(m, float(s)) for m, s in reply]
    return [(m, float(s)) for m, s in zip(reply[::2], reply[1::2], strict=True)]


def hash_items(reply: Any) -> list[tuple[Any, Any]]:
    """HGETALL's fields and values: a dict in RESP3, a flat list in RESP2."""
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[::2], reply[1::2], strict=True))


def contains_pattern(substring: str) -> str:
    """A SCAN MATCH glob for "contains ``substring``".

    One rule: ``*`` matches any run of characters and ``?`` any one; every
    other character, ``[``, ``]`` and ``\\`` included, matches itself. The
    search is always "contains" (Sidekiq uses a pattern with ``*`` verbatim,
    which matches nothing unless it starts and ends with one).
    """
    escaped = "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in substring)
    return f"*{escaped}*"


def send_signal(pool: RedisPool, identity: str, name: str) -> None:
    """Queue a remote signal (TSTP, TERM, TTIN, ...) for a process or swarm to pop.

    Not replay-safe: a replay after a lost reply would queue the signal twice,
    and a second TERM reaches a process already shutting down.
    """
    key = keys.signals(identity)
    pool.pipeline([("LPUSH", key, name), ("EXPIRE", key, keys.HEARTBEAT_TTL)],
                  transaction=True)


def sscan_all(conn: Conn, key: str) -> list[str]:
    """Every member of a SET, decoded and sorted (SSCAN, never SMEMBERS on a big set)."""
    cursor: Any = b"0"
    members: set[str] = set()
    while True:
        cursor, batch = conn.call("SSCAN", key, cursor, "COUNT", SCAN_COUNT)
        members.update(text(m) for m in batch)
        if int(cursor) == 0:
            return sorted(members)


def zscan_all(conn: Conn, key: str, pattern: str) -> list[tuple[bytes, float]]:
    """(member, score) pairs matching ``pattern``, each once (ZSCAN may repeat one)."""
    cursor: Any = b"0"
    found: dict[bytes, float] = {}
    while True:
        cursor, batch = conn.call("ZSCAN", key, cursor, "MATCH", pattern, "COUNT", SCAN_COUNT)
        found.update(score_pairs(batch))
        if int(cursor) == 0:
            return list(found.items())

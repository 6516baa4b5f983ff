"""Limiters as an operator sees them: every registered one, its kind, limit and use.

Duties:
1. :class:`LimiterSet`: the names in ``lmtr-list`` (wurk's and Sidekiq
   Enterprise's limiters register there), each read as a
   :class:`LimiterInfo`: kind, limit, what is in use now on Redis's clock
   (holders with a live lease, admissions in the window, this interval's
   count, the drained level) and the concurrent counters.
2. Read untrusted state without failing the listing: a meta hash of the
   wrong type, options that are not JSON or not usable, a state key of the
   wrong type each give that one limiter an ``error`` and leave the rest.
3. ``reset(name)``: delete a limiter's state (holders, counts, level), keep
   its registration; ``delete(name)`` also forgets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.limiter.kinds import from_options
from wurk.limiter.policy import LimiterArgumentError, check_limiter_name
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.replies import hash_items, resolve, sscan_all, text

if TYPE_CHECKING:
    from wurk.limiter.kinds import Bucket, Concurrent, Leaky, Window
    from wurk.redis.connection import Conn


class UnknownLimiterError(LookupError):
    """No limiter of that name is registered in ``lmtr-list``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no limiter named {name!r:.80} is registered")
        self.name = name


@dataclass(frozen=True)
class LimiterInfo:
    """One limiter's state. ``used`` is holders (concurrent), admissions in the
    last interval (window), this interval's count (bucket) or the level (leaky)."""

    name: str
    kind: str | None = None
    limit: int | None = None
    used: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    reclaimed: int | None = None  # concurrent: slots freed by an expired lease
    overages: int | None = None  # concurrent: releases after the lease had run out
    error: str | None = None  # why this limiter could not be read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LimiterSet:
    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def names(self) -> list[str]:
        found = self.runtime.pool.run(lambda c: sscan_all(c, keys.LIMITER_LIST),
                                          idempotent=True)
        return found

    def __iter__(self) -> Iterator[LimiterInfo]:
        return iter(self.runtime.pool.run(self._read_all, idempotent=True))

    def get(self, name: str) -> LimiterInfo:
        """One limiter; :class:`UnknownLimiterError` if it is not registered."""
        info: LimiterInfo | None = self.runtime.pool.run(
            lambda c: self._read(c, name, _now(c)) if _listed(c, name) else None,
            idempotent=True)
        if info is None:
            raise UnknownLimiterError(name)
        return info

    def reset(self, name: str) -> int:
        """Delete the limiter's state (it starts empty), keep it registered; keys deleted."""
        def block(conn: Conn) -> int | None:
            if not _listed(conn, name):
                return None
            limiter = self._build(conn, name)
            return int(conn.call("DEL", *limiter.state_keys(_now(conn))))
        # Idempotent: a replayed DEL deletes nothing more.
        deleted: int | None = self.runtime.pool.run(block, idempotent=True)
        if deleted is None:
            raise UnknownLimiterError(name)
        return deleted

    def delete(self, name: str) -> None:
        """Forget the limiter: its state, its meta hash, its name in ``lmtr-list``."""
        # Every kind's fixed keys, whatever the meta hash says (it may be garbage);
        # a bucket's per-interval counters expire within two intervals.
        doomed = [keys.limiter_meta(name), keys.limiter_concurrent(name),
                  keys.limiter_stats(name), keys.limiter_window(name), keys.limiter_leaky(name)]

        def block(conn: Conn) -> None:
            conn.call("DEL", *doomed)
            conn.call("SREM", keys.LIMITER_LIST, name)
        self.runtime.pool.run(block, idempotent=True)

    # -- reading ---------------------------------------------------------------------------
    def _read_all(self, conn: Conn) -> list[LimiterInfo]:
        now = _now(conn)
        return [self._read(conn, name, now) for name in sscan_all(conn, keys.LIMITER_LIST)]

    def _read(self, conn: Conn, name: str, now: float) -> LimiterInfo:
        try:
            limiter = self._build(conn, name)
            usage = limiter.usage(conn, now)
        except (rx.ResponseError, LimiterArgumentError, KeyError, TypeError, ValueError) as exc:
            return LimiterInfo(name, error=f"{type(exc).__name__}: {exc}"[:300])
        return LimiterInfo(name, limiter.kind, int(limiter.limit), usage.pop("used"),
                           limiter.options(), **usage)

    def _build(self, conn: Conn, name: str) -> Concurrent | Window | Bucket | Leaky:
        """The limiter its meta hash describes; raises on anything unusable."""
        check_limiter_name(name)
        meta = {text(k): text(v) for k, v in hash_items(conn.call("HGETALL",
                                                                  keys.limiter_meta(name)))}
        if "type" not in meta:
            raise KeyError(f"{keys.limiter_meta(name)} is gone (expired or deleted)")
        options = json.loads(meta.get("options") or "{}")
        if not isinstance(options, dict):
            raise TypeError(f"options {meta.get('options')!r:.60} are not a JSON object")
        return from_options(name, meta["type"], options, self.config)


def _now(conn: Conn) -> float:
    seconds, micros = conn.call("TIME")
    return int(seconds) + int(micros) / 1_000_000


def _listed(conn: Conn, name: str) -> bool:
    return bool(conn.call("SISMEMBER", keys.LIMITER_LIST, name))

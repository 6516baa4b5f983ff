"""The four limiters, each one Lua check (``wurk.wire.limiter_lua``) and its reading.

Duties:
1. :class:`Concurrent`: at most ``limit`` holders at once; each holds a
   lease of ``lease`` seconds (a member of ``lmtr-cs:<name>`` scored by its
   expiry), so a holder killed with SIGKILL frees its slot when its lease
   runs out. ``lease`` is therefore the longest a block may hold the slot;
   a longer holder calls ``permit.renew()``. Release is a second round trip;
   one Redis refused is sent again until it lands or the lease ends.
2. :class:`Window`: at most ``limit`` admissions in any ``interval`` seconds
   (a sliding window, as Sidekiq Enterprise's window limiter).
3. :class:`Bucket`: at most ``limit`` admissions per interval, the intervals
   aligned to the epoch and the count reset at each boundary (Sidekiq
   Enterprise's bucket limiter); bursts of up to ``2 * limit`` can straddle
   a boundary.
4. :class:`Leaky`: a bucket of ``limit`` that drains continuously at
   ``limit / interval`` per second; each admission adds one.
5. For the admin API: :meth:`~Concurrent.usage` reads what is in use now,
   and :meth:`~Concurrent.state_keys` names the keys a reset deletes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from wurk.limiter.base import Limiter, Permit, _number
from wurk.limiter.policy import check_limit, check_seconds
from wurk.wire import keys
from wurk.wire.limiter_lua import (
    BUCKET_ACQUIRE,
    CONCURRENT_ACQUIRE,
    CONCURRENT_RELEASE,
    CONCURRENT_RENEW,
    LEAKY_ACQUIRE,
    WINDOW_ACQUIRE,
)

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.settings.config import Config
    from wurk.wire.lua import Script


class Concurrent(Limiter):
    kind = "concurrent"
    script = CONCURRENT_ACQUIRE
    _replay_safe = True  # a replayed check finds its own member and takes no second slot

    def __init__(self, name: str, limit: Any, *, lease: Any = 30.0, **options: Any) -> None:
        super().__init__(name, limit, **options)
        self.lease = check_seconds(lease, "lease", most=7 * 86_400.0)

    @staticmethod
    def _check_limit(limit: Any) -> float:
        return check_limit(limit)

    def _keys(self) -> list[str]:
        return [keys.limiter_concurrent(self.name), keys.limiter_stats(self.name)]

    def _args(self, member: str, state: list[str]) -> list[Any]:
        return [int(self.limit), self.lease, member]

    def options(self) -> dict[str, Any]:
        return {"limit": int(self.limit), "lock_timeout": _number(self.lease)}

    def release_request(self, permit: Permit) -> tuple[Script, list[str], list[Any]]:
        return CONCURRENT_RELEASE, self._keys(), [permit.member, keys.LIMITER_TTL]

    def lease_of(self) -> float:
        return self.lease

    def release(self, permit: Permit) -> None:
        """Free the slot; one round trip. A failure here never hides the block's
        own outcome: it is logged, and kept to send again within the lease."""
        request = self.release_request(permit)
        script, release_keys, args = request
        try:
            # Replay-safe: a second ZREM finds nothing (it may count one overage).
            self._run(lambda c: script.run(c, release_keys, args), idempotent=True)
        except Exception as exc:  # noqa: BLE001 - kept and sent again, or left to the lease
            self.release_refused(permit, request, exc)

    def renew(self, permit: Permit) -> bool:
        if permit.released:
            return False
        cs = keys.limiter_concurrent(self.name)
        sent = time.monotonic()
        renewed = self._run(lambda c: CONCURRENT_RENEW.run(c, [cs], [permit.member, self.lease]),
                            idempotent=True)
        if renewed:
            permit.since = sent
        return bool(renewed)

    def usage(self, conn: Conn, now: float) -> dict[str, Any]:
        held = conn.call("ZCOUNT", keys.limiter_concurrent(self.name), f"({now!r}", "+inf")
        stats = conn.call("HMGET", keys.limiter_stats(self.name), "reclaimed", "overages")
        return {"used": int(held), "reclaimed": _count(stats[0]), "overages": _count(stats[1])}

    def state_keys(self, now: float) -> list[str]:
        return [keys.limiter_concurrent(self.name), keys.limiter_stats(self.name)]


class _Periodic(Limiter):
    """A limit per ``interval`` seconds (window, bucket, leaky)."""

    def __init__(self, name: str, limit: Any, *, interval: Any = 1.0, **options: Any) -> None:
        super().__init__(name, limit, **options)
        self.interval = check_seconds(interval, "interval")

    @staticmethod
    def _check_limit(limit: Any) -> float:
        return check_limit(limit)

    def options(self) -> dict[str, Any]:
        return {"count": int(self.limit), "interval": _number(self.interval)}


class Window(_Periodic):
    kind = "window"
    script = WINDOW_ACQUIRE
    _replay_safe = True  # a replayed check finds its own member and counts once

    def _keys(self) -> list[str]:
        return [keys.limiter_window(self.name)]

    def _args(self, member: str, state: list[str]) -> list[Any]:
        return [int(self.limit), self.interval, member]

    def usage(self, conn: Conn, now: float) -> dict[str, Any]:
        since = f"({now - self.interval!r}"
        return {"used": int(conn.call("ZCOUNT", keys.limiter_window(self.name), since, "+inf"))}

    def state_keys(self, now: float) -> list[str]:
        return [keys.limiter_window(self.name)]


class Bucket(_Periodic):
    kind = "bucket"
    script = BUCKET_ACQUIRE

    def _keys(self) -> list[str]:
        # This host's idea of the interval; the script picks by Redis's clock.
        base = self.epoch(time.time())
        return [keys.limiter_bucket(self.name, base + step) for step in (-1, 0, 1)]

    def _args(self, member: str, state: list[str]) -> list[Any]:
        # The interval number the keys were built for: the middle key's suffix.
        return [int(self.limit), self.interval, state[1].rpartition(":")[2]]

    def usage(self, conn: Conn, now: float) -> dict[str, Any]:
        raw = conn.call("GET", keys.limiter_bucket(self.name, self.epoch(now)))
        return {"used": _count(raw)}

    def epoch(self, now: float) -> int:
        """The interval ``now`` falls in, as the script numbers it."""
        return int(now // self.interval)

    def state_keys(self, now: float) -> list[str]:
        return [keys.limiter_bucket(self.name, self.epoch(now))]


class Leaky(_Periodic):
    kind = "leaky"
    script = LEAKY_ACQUIRE

    @property
    def rate(self) -> float:
        """Drained per second."""
        return self.limit / self.interval

    def _keys(self) -> list[str]:
        return [keys.limiter_leaky(self.name)]

    def _args(self, member: str, state: list[str]) -> list[Any]:
        return [int(self.limit), repr(self.rate)]

    def options(self) -> dict[str, Any]:
        return {"bucket_size": int(self.limit), "drain": _number(self.interval)}

    def usage(self, conn: Conn, now: float) -> dict[str, Any]:
        level, last = conn.call("HMGET", keys.limiter_leaky(self.name), "level", "last")
        if level is None:
            return {"used": 0.0}
        drained = float(level) - max(0.0, now - float(last or now)) * self.rate
        return {"used": round(max(0.0, drained), 3)}

    def state_keys(self, now: float) -> list[str]:
        return [keys.limiter_leaky(self.name)]


KINDS: dict[str, type[Concurrent | Window | Bucket | Leaky]] = {
    "concurrent": Concurrent, "window": Window, "bucket": Bucket, "leaky": Leaky}


def from_options(name: str, kind: str, options: dict[str, Any],
                 config: Config | None = None) -> Concurrent | Window | Bucket | Leaky:
    """Rebuild a limiter from its ``lmtr:<name>`` hash (untrusted: raises
    LimiterArgumentError or KeyError on anything it cannot use)."""
    wait = options.get("wait_timeout", 5)
    if kind == "concurrent":
        return Concurrent(name, options["limit"], lease=options.get("lock_timeout", 30),
                          wait_timeout=wait, config=config)
    if kind == "leaky":
        return Leaky(name, options["bucket_size"], interval=options["drain"],
                     wait_timeout=wait, config=config)
    if kind in ("window", "bucket"):
        return KINDS[kind](name, options["count"], interval=options["interval"],
                           wait_timeout=wait, config=config)
    raise KeyError(f"unknown limiter type {kind!r:.40}")


def _count(raw: Any) -> int:
    try:
        return int(raw) if raw is not None else 0
    except (TypeError, ValueError):
        return 0

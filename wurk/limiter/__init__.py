"""Cluster-wide rate and concurrency limiters in Redis, Sidekiq Enterprise's four kinds.

    import wurk

    STRIPE = wurk.limiter.concurrent("stripe", 5, lease=30, wait_timeout=5)
    API = wurk.limiter.window("partner-api", 10, interval=1)

    with STRIPE.acquire():
        ...

Each check is one Lua script (one round trip) on Redis's clock, so the
limit holds across threads, processes and hosts. ``acquire`` waits up to
``wait_timeout`` seconds, polling with backoff, then raises
:class:`OverLimit`; inside a job, wurk then reschedules the job without
spending a retry (``wurk.runtime.overlimit``). The keys are Sidekiq
Enterprise's (``lmtr-cs:<name>``, ``lmtr-w:<name>``, ...), documented in
docs/reference/redis-format.md.

Modules: ``policy`` (argument checks, poll and reschedule delays: pure),
``base`` (the waiting acquire, permits, errors), ``kinds`` (the four kinds).
"""

from __future__ import annotations

from typing import Any

from wurk.limiter.base import Limiter, LimiterStateError, OverLimit, Permit, Refusal
from wurk.limiter.kinds import Bucket, Concurrent, Leaky, Window
from wurk.limiter.policy import LimiterArgumentError

__all__ = [
    "Bucket",
    "Concurrent",
    "Leaky",
    "Limiter",
    "LimiterArgumentError",
    "LimiterStateError",
    "OverLimit",
    "Permit",
    "Refusal",
    "Window",
    "bucket",
    "concurrent",
    "leaky",
    "window",
]


def concurrent(name: str, limit: int, *, lease: float = 30.0, wait_timeout: float = 5.0,
               **options: Any) -> Concurrent:
    """At most ``limit`` holders at once across the cluster; a holder's slot frees
    itself ``lease`` seconds after it was taken (or renewed) if never released."""
    return Concurrent(name, limit, lease=lease, wait_timeout=wait_timeout, **options)


def window(name: str, limit: int, *, interval: float | str = 1.0, wait_timeout: float = 5.0,
           **options: Any) -> Window:
    """At most ``limit`` admissions in any ``interval`` seconds (a sliding window)."""
    return Window(name, limit, interval=interval, wait_timeout=wait_timeout, **options)


def bucket(name: str, limit: int, *, interval: float | str = 1.0, wait_timeout: float = 5.0,
           **options: Any) -> Bucket:
    """At most ``limit`` admissions per ``interval``, counted afresh at each
    interval boundary (intervals aligned to the Unix epoch)."""
    return Bucket(name, limit, interval=interval, wait_timeout=wait_timeout, **options)


def leaky(name: str, limit: int, *, interval: float | str = 1.0, wait_timeout: float = 5.0,
          **options: Any) -> Leaky:
    """A bucket holding ``limit`` that drains at ``limit / interval`` per second;
    each admission adds one, refused while it would overflow."""
    return Leaky(name, limit, interval=interval, wait_timeout=wait_timeout, **options)

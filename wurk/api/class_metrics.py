"""Per-class execution metrics read back from Sidekiq 7's keys (wurk's and Ruby's).

Workers (wurk with ``class_metrics`` on, Ruby Sidekiq 7.x) add to one hash
per UTC minute, ``j|YYYYMMDD|H:M``, fields ``Class|p`` (executions),
``Class|f`` (failures) and ``Class|ms`` (milliseconds of the successful
runs), and to a histogram per class and minute, ``Class-DD-HH:M``, of 26
u16 counters (:mod:`wurk.observe.class_metrics`). Both expire after 8 hours.
Sidekiq 6.x records neither.

Duties:
1. :meth:`ClassMetricsQuery.top`: every class's totals over the last
   ``hours`` (1 to 8): one pipeline of ``HGETALL`` per minute, never a scan.
2. :meth:`ClassMetricsQuery.for_class`: one class's per-minute executions,
   failures and time, and its histogram summed over the window (``BITFIELD_RO``
   per minute, in one more pipeline).
3. Distrust what is read: a field without a known suffix, a count that is
   not a number or is negative, a key of the wrong type are skipped, never
   raised.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis.exceptions as rx

from wurk.api.common import hash_items, resolve, text
from wurk.observe.class_metrics import (
    LABELS,
    MAX_CLASS,
    SLOTS,
    histogram_key,
    minute_key,
)
from wurk.redis.pools import pool_for
from wurk.settings.config import Config

HOURS = (1, 2, 4, 8)
MAX_HOURS = 8  # the keys live 8 hours
SUFFIXES = {"p": "processed", "f": "failed", "ms": "ms"}
_GETS = [x for i in range(SLOTS) for x in ("GET", "u16", f"#{i}")]


@dataclass
class ClassTotals:
    name: str
    processed: int = 0
    failed: int = 0
    ms: int = 0

    @property
    def average_ms(self) -> float:
        """Mean time of a successful run (failures are not timed, as in Sidekiq)."""
        done = self.processed - self.failed
        return self.ms / done if done > 0 else 0.0


@dataclass
class ClassSeries:
    """One class, minute by minute (oldest first), and its summed histogram."""

    name: str
    minutes: list[str] = field(default_factory=list)
    processed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    ms: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=lambda: [0] * SLOTS)
    labels: tuple[str, ...] = LABELS

    @property
    def totals(self) -> ClassTotals:
        return ClassTotals(self.name, sum(self.processed), sum(self.failed), sum(self.ms))


def count(value: object) -> int | None:
    """A counter read from Redis, or None when it is no non-negative integer."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _target(raw_field: Any) -> tuple[str, str] | None:
    """The class and counter a ``Class|p`` field adds to; None for a field of no use."""
    name, _, suffix = text(raw_field).rpartition("|")
    if not name or suffix not in SUFFIXES:
        return None
    return name, SUFFIXES[suffix]


def minutes_back(hours: int, now: float | None = None) -> list[datetime]:
    """The UTC minutes of the last ``hours``, oldest first."""
    if not 1 <= hours <= MAX_HOURS:
        raise ValueError(f"hours must be between 1 and {MAX_HOURS}, got {hours}")
    end = int(time.time() if now is None else now) // 60 * 60
    return [datetime.fromtimestamp(end - 60 * n, UTC) for n in range(hours * 60 - 1, -1, -1)]


class ClassMetricsQuery:
    """What the workers recorded per class, over the last hours."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)

    def top(self, hours: int = 1, now: float | None = None) -> list[ClassTotals]:
        """Every class seen in the window, most executions first."""
        minutes = minutes_back(hours, now)
        replies = pool_for(self.config).run(lambda c: c.pipeline(
            [("HGETALL", minute_key(m)) for m in minutes], raise_on_error=False),
            idempotent=True)
        found: dict[str, ClassTotals] = {}
        # The same few fields come back every minute: each is parsed once.
        parsed: dict[Any, tuple[str, str] | None] = {}
        for reply in replies:
            if isinstance(reply, rx.ResponseError):
                continue
            for raw_field, raw_value in hash_items(reply):
                if raw_field not in parsed:
                    parsed[raw_field] = _target(raw_field)
                target, value = parsed[raw_field], count(raw_value)
                if target is not None and value is not None:
                    name, attr = target
                    totals = found.get(name) or found.setdefault(name, ClassTotals(name))
                    setattr(totals, attr, getattr(totals, attr) + value)
        return sorted(found.values(), key=lambda t: (-t.processed, t.name))

    def for_class(self, name: str, hours: int = 1, now: float | None = None) -> ClassSeries:
        if not name or len(name) > MAX_CLASS:
            raise ValueError("a class name of 1 to 1024 characters")
        minutes = minutes_back(hours, now)
        fields = [f"{name}|p", f"{name}|f", f"{name}|ms"]
        commands = [("HMGET", minute_key(m), *fields) for m in minutes]
        commands += [("BITFIELD_RO", histogram_key(name, m), *_GETS) for m in minutes]
        replies = pool_for(self.config).run(
            lambda c: c.pipeline(commands, raise_on_error=False), idempotent=True)
        series = ClassSeries(name)
        for minute, reply in zip(minutes, replies[: len(minutes)], strict=True):
            values = [0, 0, 0] if isinstance(reply, rx.ResponseError) else [
                count(v) or 0 for v in reply]
            series.minutes.append(f"{minute:%H:%M}")
            series.processed.append(values[0])
            series.failed.append(values[1])
            series.ms.append(values[2])
        for reply in replies[len(minutes):]:
            if isinstance(reply, list) and len(reply) == SLOTS:
                series.histogram = [a + (count(b) or 0) for a, b in
                                    zip(series.histogram, reply, strict=True)]
        return series


__all__ = ["HOURS", "MAX_CLASS", "ClassMetricsQuery", "ClassSeries", "ClassTotals"]

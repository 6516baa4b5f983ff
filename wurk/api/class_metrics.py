"""Per-class execution metrics read back from Sidekiq 7's and 8's keys (wurk's and Ruby's).

Workers add fields ``Class|p`` (executions), ``Class|f`` (failures) and
``Class|ms`` (milliseconds of the successful runs) to a hash per UTC
minute, and 26 u16 counters to a histogram per class and minute
(:mod:`wurk.observe.class_metrics`). Two layouts, whose key names never
collide, so a reader sums them: Sidekiq 7.x (and wurk with
``class_metrics_format = "sidekiq7"``) writes ``j|YYYYMMDD|H:M`` and
``Class-DD-HH:M``; Sidekiq 8.x (and wurk by default) writes
``j|YYMMDD|H:MM``, ``h|Class-D-H:M`` and also a 10-minute rollup
``j|YYMMDD|H:T``. Sidekiq 6.x records nothing.

Duties:
1. :meth:`ClassMetricsQuery.top`: every class's totals over the last
   ``hours`` (1 to 8), one pipeline of ``HGETALL``, never a scan. One hour:
   both layouts' minute hashes. Longer (as Sidekiq 8's Web): the 10-minute
   rollups, which hold the Sidekiq 8 layout's figures, plus the Sidekiq 7
   layout's minute hashes (nothing else holds those); 8 hours of 200 classes
   is then 48 hashes of 600 fields instead of 480.
2. :meth:`ClassMetricsQuery.for_class`: one class's per-minute executions,
   failures and time, and its histogram summed over the window (``HMGET``
   and ``BITFIELD_RO`` per minute and layout, in one pipeline).
3. Distrust what is read: a field without a known suffix, a count that is
   not a number or is negative, a key of the wrong type are skipped, never
   raised.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from wurk.observe.class_metrics import (
    LABELS,
    MAX_CLASS,
    SLOTS,
    histogram_key,
    histogram_key8,
    minute_key,
    minute_key8,
    rollup_key,
)
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire.replies import resolve, text

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


def window_keys(hours: int, now: float | None = None) -> list[str]:
    """The minute (one hour) or rollup (longer) hashes whose fields add up to the window."""
    if hours == 1:
        return [key for at in minutes_back(1, now) for key in (minute_key(at), minute_key8(at))]
    minutes = minutes_back(hours, now)
    # 6 blocks an hour, the last one holding now: the window starts at a block's start.
    end = minutes[-1]
    start = end.timestamp() - 60 * (end.minute % 10) - 600 * (hours * 6 - 1)
    kept = [at for at in minutes if at.timestamp() >= start]
    return [*(rollup_key(at) for at in kept if at.minute % 10 == 0),
            *(minute_key(at) for at in kept)]


def add_up(replies: list[Any]) -> dict[Any, int]:
    """Each raw field's sum over the hashes; a reply or value that is no count is skipped."""
    sums: dict[Any, int] = {}
    get = sums.get
    for reply in replies:
        if isinstance(reply, dict):
            items: Any = reply.items()
        elif isinstance(reply, list):
            flat = iter(reply)
            items = zip(flat, flat, strict=False)
        else:
            continue  # an error reply: a key of the wrong type
        for raw_field, raw_value in items:
            try:
                value = int(raw_value)
            except (TypeError, ValueError):
                continue
            if value >= 0:
                sums[raw_field] = get(raw_field, 0) + value
    return sums


class ClassMetricsQuery:
    """What the workers recorded per class, over the last hours."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def top(self, hours: int = 1, now: float | None = None) -> list[ClassTotals]:
        """Every class seen in the window, most executions first."""
        keys = window_keys(hours, now)
        replies = self.runtime.pool.run(lambda c: c.pipeline(
            [("HGETALL", key) for key in keys], raise_on_error=False), idempotent=True)
        found: dict[str, ClassTotals] = {}
        for raw_field, value in add_up(replies).items():
            target = _target(raw_field)
            if target is not None:
                name, attr = target
                totals = found.get(name) or found.setdefault(name, ClassTotals(name))
                setattr(totals, attr, getattr(totals, attr) + value)
        return sorted(found.values(), key=lambda t: (-t.processed, t.name))

    def for_class(self, name: str, hours: int = 1, now: float | None = None) -> ClassSeries:
        """Per minute, both layouts added; the histograms of the minutes that had runs."""
        if not name or len(name) > MAX_CLASS:
            raise ValueError("a class name of 1 to 1024 characters")
        minutes = minutes_back(hours, now)
        fields = [f"{name}|p", f"{name}|f", f"{name}|ms"]
        layouts = ((minute_key, histogram_key), (minute_key8, histogram_key8))
        pool = self.runtime.pool
        counts = pool.run(lambda c: c.pipeline(
            [("HMGET", hashed(m), *fields) for m in minutes for hashed, _ in layouts],
            raise_on_error=False), idempotent=True)
        series = ClassSeries(name)
        grams: list[tuple[Any, ...]] = []  # a histogram only where that layout counted a run
        for index, minute in enumerate(minutes):
            values = [0, 0, 0]
            for (_, gram), reply in zip(layouts, counts[2 * index: 2 * index + 2], strict=True):
                if isinstance(reply, list) and len(reply) == 3:
                    got = [count(v) or 0 for v in reply]
                    values = [a + b for a, b in zip(values, got, strict=True)]
                    if got[0]:
                        grams.append(("BITFIELD_RO", gram(name, minute), *_GETS))
            series.minutes.append(f"{minute:%H:%M}")
            series.processed.append(values[0])
            series.failed.append(values[1])
            series.ms.append(values[2])
        replies = pool.run(lambda c: c.pipeline(grams, raise_on_error=False),
                           idempotent=True) if grams else []
        for reply in replies:
            if isinstance(reply, list) and len(reply) == SLOTS:
                series.histogram = [a + (count(b) or 0) for a, b in
                                    zip(series.histogram, reply, strict=True)]
        return series


__all__ = ["HOURS", "MAX_CLASS", "ClassMetricsQuery", "ClassSeries", "ClassTotals", "add_up",
           "window_keys"]

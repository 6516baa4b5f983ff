"""Cluster-wide numbers, as Sidekiq's dashboard reads them (spec §8, §13).

Duties:
1. :class:`Stats`: read the fast counters in one pipelined round trip when
   built (processed, failed, the three set sizes, the unpruned process
   count, the default queue's latency), and the slow ones on demand
   (``enqueued``: LLEN over every queue; ``workers_size``: the sum of
   ``busy`` over every process).
2. ``queues()``: name to size, largest first; ``reset(*names)`` zeroes the
   global counters.
3. :class:`History`: processed and failed per UTC day for N days back, one
   MGET each; a missing day is 0.
4. :func:`redis_info`: the INFO fields a dashboard shows (version, memory,
   clients, uptime), as text.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import latency_of
from wurk.wire.replies import resolve, sscan_all, text, to_int

if TYPE_CHECKING:
    from wurk.redis.connection import Conn

COUNTERS = {"processed": keys.STAT_PROCESSED, "failed": keys.STAT_FAILED}
MAX_HISTORY_DAYS = 5 * 365  # the per-day keys live five years


class Stats:
    """A snapshot taken at construction; ``refresh()`` takes a new one."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)
        self.refresh()

    def refresh(self) -> None:
        replies = self.runtime.pool.pipeline([
            ("GET", keys.STAT_PROCESSED), ("GET", keys.STAT_FAILED),
            ("ZCARD", keys.SCHEDULE), ("ZCARD", keys.RETRY), ("ZCARD", keys.DEAD),
            ("SCARD", keys.PROCESSES), ("LINDEX", keys.queue("default"), -1),
        ], idempotent=True)
        self.processed, self.failed = to_int(replies[0]), to_int(replies[1])
        self.scheduled_size, self.retry_size, self.dead_size = (int(n) for n in replies[2:5])
        self.processes_size = int(replies[5])
        self.default_queue_latency = latency_of(replies[6])
        self._slow: dict[str, int] | None = None

    @property
    def enqueued(self) -> int:
        """Jobs waiting in every known queue."""
        return self._slow_stats()["enqueued"]

    @property
    def workers_size(self) -> int:
        """Jobs running now: the sum of ``busy`` over processes (as of their last beat)."""
        return self._slow_stats()["workers_size"]

    def _slow_stats(self) -> dict[str, int]:
        if self._slow is None:
            self._slow = self.runtime.pool.run(_read_slow, idempotent=True)
        return self._slow

    def queues(self) -> dict[str, int]:
        """Queue name to size, largest first (ties by name)."""
        sizes = self.runtime.pool.run(_queue_sizes, idempotent=True)
        return dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))

    def reset(self, *names: str) -> None:
        """Zero ``processed`` and/or ``failed`` (both when none are named)."""
        unknown = sorted(set(names) - set(COUNTERS))
        if unknown:
            raise ValueError(f"unknown stat {unknown[0]!r}; choose from processed, failed")
        pairs = [x for name in (names or tuple(COUNTERS)) for x in (COUNTERS[name], 0)]
        # Not replay-safe: a replay after a lost reply would zero the counters
        # again, discarding whatever the fleet counted in between.
        self.runtime.pool.call("MSET", *pairs)
        self.refresh()


def _queue_sizes(conn: Conn) -> dict[str, int]:
    names = sscan_all(conn, keys.QUEUES)
    sizes = conn.pipeline([("LLEN", keys.queue(name)) for name in names])
    return {name: int(size) for name, size in zip(names, sizes, strict=True)}


def _read_slow(conn: Conn) -> dict[str, int]:
    identities = sscan_all(conn, keys.PROCESSES)
    busy = conn.pipeline([("HGET", identity, "busy") for identity in identities])
    return {"workers_size": sum(to_int(b) for b in busy),
            "enqueued": sum(_queue_sizes(conn).values())}


class History:
    """Per-day ``processed`` and ``failed`` for ``days`` days ending ``start_date`` (UTC)."""

    def __init__(self, days: int, start_date: date | None = None, *,
                 config: Config | None = None) -> None:
        if not 1 <= days <= MAX_HISTORY_DAYS:
            raise ValueError(f"days must be between 1 and {MAX_HISTORY_DAYS}, got {days}")
        self.days = days
        self.start_date = start_date or datetime.now(UTC).date()
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    @property
    def dates(self) -> list[str]:
        """``YYYY-MM-DD`` from ``start_date`` back, newest first."""
        return [(self.start_date - timedelta(days=i)).isoformat() for i in range(self.days)]

    @property
    def processed(self) -> dict[str, int]:
        return self._per_day("processed")

    @property
    def failed(self) -> dict[str, int]:
        return self._per_day("failed")

    def _per_day(self, stat: str) -> dict[str, int]:
        dates = self.dates
        values: list[Any] = self.runtime.pool.call(
            "MGET", *(keys.daily_stat(stat, day) for day in dates), idempotent=True)
        return {day: to_int(value) for day, value in zip(dates, values, strict=True)}


INFO_FIELDS = ("redis_version", "uptime_in_days", "uptime_in_seconds", "connected_clients",
               "used_memory_human", "used_memory_peak_human", "maxmemory_human", "role")


def redis_info(*, config: Config | None = None) -> dict[str, str]:
    """INFO's ``name:value`` lines for :data:`INFO_FIELDS` (those the server sent)."""
    reply = runtime_for(resolve(config)).pool.call("INFO", idempotent=True)
    if isinstance(reply, dict):  # a client that parses INFO itself
        pairs = [(str(k), text(v)) for k, v in reply.items()]
    else:
        pairs = [tuple(line.split(":", 1)) for line in text(reply).splitlines()  # type: ignore[misc]
                 if ":" in line and not line.startswith("#")]
    return {name: value.strip() for name, value in pairs if name in INFO_FIELDS}

"""The sane range of every numeric setting, in one table.

A setting outside its range is refused when the config is built, so no
absurd value reaches a thread, a wait or a Redis command: a
``shutdown_timeout`` of 1e10 overflows ``threading``'s waits, a
``concurrency`` of ten million exhausts memory before the first job.

Duties:
1. Name the bounds as constants (``MAX_CONCURRENCY``, ``MAX_TIMEOUT``...)
   that other validators (the swarm's topology, queue weights) share.
2. :data:`RANGES`: each numeric :class:`wurk.settings.config.Config` field with its
   inclusive range; the README's configuration table shows the same text
   that :meth:`Range.describe` gives (a test holds them together).
3. :func:`range_problems`: the settings of a config outside their range,
   as (key, reason) pairs for the config's one-line errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MINUTE = 60
HOUR = 3600
DAY = 86_400
WEEK = 7 * DAY
YEAR = 365 * DAY

# Threads in one process; each may hold a Redis connection.
MAX_CONCURRENCY = 1000
MAX_POOL_SIZE = 10_000
# The shortest wait any loop may be given: below it a loop spins.
MIN_INTERVAL = 0.01
# Waits a process makes while running (drain, flush, backoff caps).
MAX_TIMEOUT = DAY
# A single Redis round trip or blocking fetch: past a minute, it is an outage.
MAX_REDIS_TIMEOUT = MINUTE
# Process entries in Redis expire after 60 s (keys.HEARTBEAT_TTL).
MAX_HEARTBEAT_INTERVAL = MINUTE
MAX_RETRIES = 100
MAX_RECOVERIES = 1000
MAX_REDIS_ATTEMPTS = 100
MAX_DEAD_JOBS = 10_000_000
MAX_BUFFERED_PUSHES = 10_000_000
MAX_REPLICAS = 100
MAX_QUEUE_WEIGHT = 10_000


@dataclass(frozen=True)
class Range:
    low: float
    high: float

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int | float) and self.low <= value <= self.high

    def describe(self) -> str:
        return f"{_number(self.low)} to {_number(self.high)}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


RANGES: dict[str, Range] = {
    "concurrency": Range(1, MAX_CONCURRENCY),
    "shutdown_timeout": Range(0, MAX_TIMEOUT),
    "max_retries": Range(0, MAX_RETRIES),
    "dead_max_jobs": Range(0, MAX_DEAD_JOBS),
    "dead_timeout": Range(0, 10 * YEAR),
    "average_scheduled_poll_interval": Range(MIN_INTERVAL, DAY),
    "poll_interval_average": Range(MIN_INTERVAL, DAY),
    "heartbeat_interval": Range(MIN_INTERVAL, MAX_HEARTBEAT_INTERVAL),
    "fetch_timeout": Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
    "reliable_poll_interval": Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
    "push_buffer_size": Range(1, MAX_BUFFERED_PUSHES),
    "push_flush_timeout": Range(0, HOUR),
    "push_replicas": Range(0, MAX_REPLICAS),
    "push_replicas_timeout": Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
    # wurk.push.spool_drain never waits longer than an hour between looks.
    "spool_interval": Range(MIN_INTERVAL, HOUR),
    "reaper_interval": Range(MIN_INTERVAL, DAY),
    "max_recoveries": Range(0, MAX_RECOVERIES),
    "redis_pool_size": Range(1, MAX_POOL_SIZE),
    "redis_connect_timeout": Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
    "redis_read_timeout": Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
    "redis_retry_attempts": Range(1, MAX_REDIS_ATTEMPTS),
    "redis_retry_base": Range(0, MAX_REDIS_TIMEOUT),
    "redis_retry_cap": Range(MIN_INTERVAL, 10 * MINUTE),
    "profile_ttl": Range(1, WEEK),
}


def range_problems(config: Any) -> list[tuple[str, str]]:
    """(key, reason) for each setting of ``config`` outside its range; None passes."""
    return [(key, f"must be from {bounds.describe()}") for key, bounds in RANGES.items()
            if getattr(config, key) is not None and getattr(config, key) not in bounds]

"""The bounds numeric settings are held to, and the range type that states them.

A setting outside its range is refused when the config is built, so no
absurd value reaches a thread, a wait or a Redis command: a
``shutdown_timeout`` of 1e10 overflows ``threading``'s waits, a
``concurrency`` of ten million exhausts memory before the first job.

Duties:
1. Name the bounds as constants (``MAX_CONCURRENCY``, ``MAX_TIMEOUT``...)
   that the declarations and other validators (queue weights) share.
2. :class:`Range`: an inclusive range and the text that states it; each
   setting's range is declared with it in :mod:`wurk.settings.declared`,
   and the generated settings reference shows :meth:`Range.describe`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# Jobs one process runs before it recycles (max_jobs, max_jobs_jitter).
MAX_JOBS_PER_PROCESS = 1_000_000_000


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

"""The admin API: read and steer a wurk (or Sidekiq) cluster through Redis.

The Python counterpart of Sidekiq's ``sidekiq/api``, over the same keys, so
it sees Ruby processes and jobs as well as wurk's. Every entry point takes
an optional ``config`` and otherwise uses ``wurk.default_config()``.

Modules, one concern each:
- ``stats``: :class:`Stats` and :class:`History`, the dashboard numbers.
- ``queue``: :class:`Queue`: size, latency, pause, browse, clear.
- ``records``: :class:`JobRecord`, one job read for display and removal.
- ``sorted_sets`` / ``entries``: the schedule, retry and dead sets and the
  moves between them (:class:`SortedEntry`).
- ``processes``: :class:`ProcessSet`, :class:`Process` and remote control.
- ``swarms``: :class:`SwarmSet`, :class:`SwarmProcess`: live ``wurk-swarm``
  parents and remote control of a whole swarm.
- ``workers``: :class:`Workers`, the jobs running now.
- ``periodic``: :class:`PeriodicSet`: periodic entries, their next runs and
  last runs, pause and unpause.
- ``limiters``: :class:`LimiterSet`, every registered limiter and its use.
- ``unique``: :class:`UniqueLocks`, the locks of unique jobs.
- ``class_metrics``: :class:`wurk.api.class_metrics.ClassMetricsQuery`,
  per-class executions, failures and time from Sidekiq 7's metrics keys.
- ``paging``: one page of a queue or set, and searches that never read a
  big key whole (the dashboard's data).
- ``batches``: :class:`BatchSet`, :class:`BatchStatus`: batches, their
  counts, failures and callbacks.
- ``removal``: jobs deleted or killed by hand, one or a whole queue or
  set, with their locks, batch counts and result waiters.
- ``cancelling``: :func:`cancel`: one job by jid, waiting or running.
- ``errors``: the lookup and control errors callers catch.

Apply-safety: every read is declared idempotent to the pool; every write
says next to it whether a replay after a lost reply would be harmless.
"""

from wurk.api.cancelling import Cancelled, cancel
from wurk.api.entries import SortedEntry
from wurk.api.errors import (
    JobDeletedError,
    JobKilledError,
    JobNotFoundError,
    ProcessControlError,
    UnknownProcessError,
    UnknownQueueError,
)
from wurk.api.limiters import LimiterInfo, LimiterSet, UnknownLimiterError
from wurk.api.paging import (
    Page,
    entry_key,
    find_entry,
    find_queued,
    queue_page,
    search_set,
    set_page,
)
from wurk.api.periodic import PeriodicInfo, PeriodicRun, PeriodicSet, UnknownPeriodicError
from wurk.api.processes import Process, ProcessSet
from wurk.api.queue import Queue
from wurk.api.records import JobRecord
from wurk.api.sorted_sets import DeadSet, RetrySet, ScheduledSet, SortedSet
from wurk.api.stats import History, Stats, redis_info
from wurk.api.swarms import SwarmProcess, SwarmSet, UnknownSwarmError
from wurk.api.workers import Work, WorkEntry, Workers
from wurk.batches.api import BatchSet, BatchStatus
from wurk.unique.api import UniqueLock, UniqueLocks

__all__ = [
    "BatchSet",
    "BatchStatus",
    "Cancelled",
    "DeadSet",
    "History",
    "JobDeletedError",
    "JobKilledError",
    "JobNotFoundError",
    "JobRecord",
    "LimiterInfo",
    "LimiterSet",
    "Page",
    "PeriodicInfo",
    "PeriodicRun",
    "PeriodicSet",
    "Process",
    "ProcessControlError",
    "ProcessSet",
    "Queue",
    "RetrySet",
    "ScheduledSet",
    "SortedEntry",
    "SortedSet",
    "Stats",
    "SwarmProcess",
    "SwarmSet",
    "UniqueLock",
    "UniqueLocks",
    "UnknownLimiterError",
    "UnknownPeriodicError",
    "UnknownProcessError",
    "UnknownQueueError",
    "UnknownSwarmError",
    "Work",
    "WorkEntry",
    "Workers",
    "cancel",
    "entry_key",
    "find_entry",
    "find_queued",
    "queue_page",
    "redis_info",
    "search_set",
    "set_page",
]

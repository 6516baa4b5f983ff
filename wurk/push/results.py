"""Reading job results: ``wurk.result(jid, timeout=...)`` and what it raises.

A job pushed with ``store_result=True`` leaves its outcome under its jid
(:mod:`wurk.wire.results`); this is the reading side, usable from any
process (a web request, a script, a job or a workflow step on a worker).

Duties:
1. :func:`peek`: the stored outcome now, final or not, or None; no waiting.
2. :func:`wait`: block until the outcome is final, without polling: a
   ``BRPOPLPUSH`` of the jid's token list onto itself, which leaves the
   token in place, so any number of waiters (threads or processes) wake on
   the one write, and a waiter that comes after the job ended finds the
   record at once (it reads the record before it blocks). Returns the
   :class:`~wurk.wire.results.Outcome`, success or failure alike.
3. :func:`result`: :func:`wait`, then the value, or :class:`JobFailed`.
4. Time out with :class:`ResultTimeout`. Redis cannot tell a job that is
   still running from one that never asked for a result (or whose result
   expired): no key exists in either case, so the timeout's message names
   all three.
5. Ride out Redis trouble inside the timeout: a dropped connection or an
   outage is retried with backoff until the deadline.

Blocking waits hold a connection each, from a pool of their own
(:data:`WAIT_CONNECTIONS` per process and config), so they never starve
the pushes of the process's main pool.
"""

from __future__ import annotations

import math
import random
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from wurk.redis.policy import backoff_delay
from wurk.redis.pool import RedisPool
from wurk.redis.pools import pool_for
from wurk.redis.wait import waiting_helps
from wurk.settings.config import default_config
from wurk.wire import results
from wurk.wire.results import CorruptResultError, Outcome

if TYPE_CHECKING:
    from wurk.settings.config import Config

__all__ = ["CorruptResultError", "JobFailed", "Outcome", "ResultTimeout", "peek", "result",
           "wait"]

WAIT_CONNECTIONS = 64
# One block's longest wait: the deadline is rechecked and a lost server noticed this often.
MAX_BLOCK = 5.0
STALE_TOKEN_PAUSE = 0.1
_wait_pools: dict[int, RedisPool] = {}
_pools_lock = threading.Lock()
_rng = random.Random()


class JobFailed(Exception):  # noqa: N818 - reads as what happened: wurk.JobFailed
    """The job failed for good (it died or was dropped), or returned what JSON cannot carry."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.jid = outcome.jid
        self.error_class = outcome.error_class
        self.error_message = outcome.error_message
        super().__init__(f"job {outcome.jid} ({outcome.job_class or 'unknown class'}) failed: "
                         f"{outcome.error_class}: {outcome.error_message}")


class ResultTimeout(TimeoutError):  # noqa: N818 - the name the API documents
    """No final result within the timeout."""

    def __init__(self, jid: str, timeout: float, last: Outcome | None) -> None:
        self.jid = jid
        self.last = last
        if last is not None:
            why = (f"its last attempt failed ({last.error_class}: {last.error_message}) "
                   "and a retry is pending")
        else:
            why = ("no result is stored: the job has not finished, or it was pushed "
                   "without store_result=True, or its result expired")
        super().__init__(f"no result for job {jid} within {timeout:g} s: {why}")


def _check(jid: Any) -> str:
    if not isinstance(jid, str) or not jid:
        raise TypeError(f"a result is read by the job's jid (a non-empty string), got {jid!r}"
                        + (" (a push a middleware stopped returns None)" if jid is None else ""))
    return jid


def peek(jid: str, *, config: Config | None = None) -> Outcome | None:
    """The stored outcome now (a non-final one included), or None."""
    jid = _check(jid)
    config = config or default_config()
    raw = pool_for(config).call("GET", results.key(jid), idempotent=True)
    return None if raw is None else results.parse(jid, raw)


def wait(jid: str, timeout: float | None = 30.0, *, config: Config | None = None) -> Outcome:
    """Block until the job's outcome is final; :class:`ResultTimeout` after ``timeout``.

    ``timeout=None`` waits as long as it takes.
    """
    jid = _check(jid)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or math.isnan(timeout) or timeout < 0):
        raise TypeError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    config = config or default_config()
    deadline = None if timeout is None else time.monotonic() + timeout
    failures = 0
    woke = False
    last: Outcome | None = None
    while True:
        left = MAX_BLOCK if deadline is None else deadline - time.monotonic()
        try:
            last = peek(jid, config=config)
            if last is not None and last.final:
                return last
            if left <= 0:
                raise ResultTimeout(jid, float(timeout or 0), last)
            if woke:
                # A token without a final record (removed or expiring by
                # hand): never spin on it.
                time.sleep(min(left, STALE_TOKEN_PAUSE))
            woke = _block(config, jid, min(left, MAX_BLOCK))
            failures = 0
        except (ResultTimeout, CorruptResultError):
            raise
        except Exception as exc:
            if not waiting_helps(exc):
                raise
            failures += 1
            pause = backoff_delay(failures, config.redis_retry_base, config.redis_retry_cap, _rng)
            if deadline is not None and time.monotonic() + pause > deadline:
                raise ResultTimeout(jid, float(timeout or 0), last) from exc
            time.sleep(pause)


def result(jid: str, timeout: float | None = 30.0, *, config: Config | None = None) -> Any:
    """The value the job returned; :class:`JobFailed` if it failed for good,
    :class:`ResultTimeout` if no final result came within ``timeout`` seconds."""
    outcome = wait(jid, timeout, config=config)
    if not outcome.succeeded:
        raise JobFailed(outcome)
    return outcome.value


def _block(config: Config, jid: str, seconds: float) -> bool:
    """Wait up to ``seconds`` for the token; True if it came. The rotation
    leaves it in the list for the other waiters and the later ones."""
    ready = results.ready_key(jid)
    # Whole milliseconds, never 0 (which would mean for ever); Redis 6+ takes decimals.
    block = max(round(seconds, 3), 0.001)
    woke = _wait_pool(config).run(
        lambda c: c.call("BRPOPLPUSH", ready, ready, block,
                         timeout=block + config.redis_read_timeout),
        idempotent=True)
    return woke is not None


def _wait_pool(config: Config) -> RedisPool:
    pool = _wait_pools.get(id(config))
    if pool is None:
        with _pools_lock:
            pool = _wait_pools.get(id(config))
            if pool is None:
                pool = RedisPool.from_config(config)
                pool.size = WAIT_CONNECTIONS
                _wait_pools[id(config)] = pool
                weakref.finalize(config, _wait_pools.pop, id(config), None)
    return pool

"""Reading job results: ``wurk.result(jid, timeout=...)``, ``await wurk.aresult(jid)``,
and what they raise.

A job pushed with ``store_result=True`` leaves its outcome under its jid
(:mod:`wurk.results.records`); this is the reading side, usable from any
process (a web request, a script, a job or a workflow step on a worker).

Duties:
1. :func:`peek`: the stored outcome now, final or not, or None; no waiting.
2. :func:`wait`: block until the outcome is final, without polling: a
   ``BRPOPLPUSH`` of the jid's token list onto itself, which leaves the
   token in place, so any number of waiters (threads or processes) wake on
   the one write, and a waiter that comes after the job ended finds the
   record at once (it reads the record before it blocks). Returns the
   :class:`~wurk.results.records.Outcome`, success or failure alike.
3. :func:`result`: :func:`wait`, then the value, or :class:`JobFailed`.
   :func:`apeek`, :func:`await_outcome` and :func:`aresult` are the same for
   async code, on an asyncio pool: the decisions are one
   :class:`Waiting`, which a sync and an async driver each feed with their
   own reads, blocks and sleeps.
4. Time out with :class:`ResultTimeout`. Redis cannot tell a job that is
   still running from one that never asked for a result (or whose result
   expired): no key exists in either case, so the timeout's message names
   all three.
5. Ride out Redis trouble inside the timeout: a dropped connection or an
   outage is retried with backoff until the deadline.

Blocking waits hold a connection each, from a pool of their own
(:data:`WAIT_CONNECTIONS` per process and config; for async waits, as many
per event loop and config, opened while waits are under way and closed when
the last one ends), so they never starve the pushes of the process's main
pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.core.validate import is_number
from wurk.redis.apool import AsyncRedisPool
from wurk.redis.policy import trouble_backoff
from wurk.redis.replay import pool_settings
from wurk.redis.runtime import WAIT_CONNECTIONS, runtime_for
from wurk.redis.wait import waiting_helps
from wurk.results import records as results
from wurk.results.records import CorruptResultError, Outcome
from wurk.settings.config import default_config

if TYPE_CHECKING:
    from wurk.settings.config import Config

__all__ = ["CorruptResultError", "JobFailed", "Outcome", "ResultTimeout", "apeek", "aresult",
           "await_outcome", "peek", "result", "wait"]

# One block's longest wait: the deadline is rechecked and a lost server noticed this often.
MAX_BLOCK = 5.0
STALE_TOKEN_PAUSE = 0.1
# The testing mode's results (``wurk.testing``): while set, outcomes are read
# from it, never from Redis, and a wait does not wait (nothing runs meanwhile).
stand_in: Callable[[str], Outcome | None] | None = None
# Per event loop, per config while waits are under way; only that loop's
# coroutines touch them (no lock).
_async_waits_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                dict[int, _AsyncWaits]] = (
    weakref.WeakKeyDictionary())


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
    if stand_in is not None:
        return stand_in(jid)
    config = config or default_config()
    return _parsed(jid, runtime_for(config).pool.call("GET", results.key(jid), idempotent=True))


async def apeek(jid: str, *, config: Config | None = None) -> Outcome | None:
    """:func:`peek` for async code."""
    jid = _check(jid)
    if stand_in is not None:
        return stand_in(jid)
    config = config or default_config()
    async with _async_waits(config) as pool:
        return await _aget(pool, jid)


async def _aget(pool: AsyncRedisPool, jid: str) -> Outcome | None:
    return _parsed(jid, await pool.call("GET", results.key(jid), idempotent=True))


def _parsed(jid: str, raw: Any) -> Outcome | None:
    return None if raw is None else results.parse(jid, raw)


@dataclass(frozen=True)
class Block:
    """The next wait: a pause first (a token without a final record), then a block."""

    pause: float
    seconds: float


class Waiting:
    """One wait's decisions, no I/O: what to do after each read, block and failure.

    :func:`wait` and :func:`await_outcome` drive it, each with its own
    Redis calls and sleeps.
    """

    def __init__(self, jid: Any, timeout: float | None, config: Config, now: float) -> None:
        self.jid = _check(jid)
        if timeout is not None and (not is_number(timeout) or math.isnan(timeout)
                                    or timeout < 0):
            raise TypeError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        self.timeout = timeout
        self.deadline = None if timeout is None else now + timeout
        self.backoff = trouble_backoff(config.redis_retry_base, config.redis_retry_cap)
        self.failures = 0
        self.woke = False
        self.last: Outcome | None = None

    def read(self, outcome: Outcome | None, now: float) -> Outcome | Block:
        """After reading the record: the final outcome, else the next block
        (:class:`ResultTimeout` once the time is up)."""
        left = MAX_BLOCK if self.deadline is None else self.deadline - now
        self.last = outcome
        if outcome is not None and outcome.final:
            return outcome
        if left <= 0:
            raise self._timed_out()
        # A token without a final record (removed or expiring by hand): never spin on it.
        pause = min(left, STALE_TOKEN_PAUSE) if self.woke else 0.0
        return Block(pause, min(left, MAX_BLOCK))

    def blocked(self, woke: bool) -> None:
        """A block ended: the token came (``woke``) or its time did."""
        self.woke = woke
        self.failures = 0

    def failed(self, exc: Exception, now: float) -> float | None:
        """The pause before trying again after ``exc``, or None: raise it.
        :class:`ResultTimeout` when the pause would pass the deadline."""
        if isinstance(exc, ResultTimeout | CorruptResultError) or not waiting_helps(exc):
            return None
        self.failures += 1
        pause = self.backoff.delay(self.failures)
        if self.deadline is not None and now + pause > self.deadline:
            raise self._timed_out() from exc
        return pause

    def _timed_out(self) -> ResultTimeout:
        return ResultTimeout(self.jid, float(self.timeout or 0), self.last)


def wait(jid: str, timeout: float | None = 30.0, *, config: Config | None = None) -> Outcome:
    """Block until the job's outcome is final; :class:`ResultTimeout` after ``timeout``.

    ``timeout=None`` waits as long as it takes.
    """
    config = config or default_config()
    waiting = Waiting(jid, timeout, config, time.monotonic())
    while True:
        try:
            step = waiting.read(peek(waiting.jid, config=config), time.monotonic())
            if isinstance(step, Outcome):
                return step
            if step.pause:
                time.sleep(step.pause)
            waiting.blocked(_block(config, waiting.jid, step.seconds))
        except Exception as exc:
            pause = waiting.failed(exc, time.monotonic())
            if pause is None:
                raise
            time.sleep(pause)


async def await_outcome(jid: str, timeout: float | None = 30.0, *,
                        config: Config | None = None) -> Outcome:
    """:func:`wait` for async code: the same decisions, awaited on the running loop."""
    if stand_in is not None:
        return wait(jid, timeout, config=config)  # testing mode: never blocks, no Redis
    config = config or default_config()
    waiting = Waiting(jid, timeout, config, time.monotonic())
    async with _async_waits(config) as pool:
        while True:
            try:
                step = waiting.read(await _aget(pool, waiting.jid), time.monotonic())
                if isinstance(step, Outcome):
                    return step
                if step.pause:
                    await asyncio.sleep(step.pause)
                waiting.blocked(await _ablock(pool, config, waiting.jid, step.seconds))
            except Exception as exc:
                pause = waiting.failed(exc, time.monotonic())
                if pause is None:
                    raise
                await asyncio.sleep(pause)


def result(jid: str, timeout: float | None = 30.0, *, config: Config | None = None) -> Any:
    """The value the job returned; :class:`JobFailed` if it failed for good,
    :class:`ResultTimeout` if no final result came within ``timeout`` seconds."""
    return value_of(wait(jid, timeout, config=config))


async def aresult(jid: str, timeout: float | None = 30.0, *,
                  config: Config | None = None) -> Any:
    """``await wurk.aresult(jid)``: :func:`result` for async code, never blocking the loop."""
    return value_of(await await_outcome(jid, timeout, config=config))


def value_of(outcome: Outcome) -> Any:
    """A final outcome's value, or :class:`JobFailed`."""
    if not outcome.succeeded:
        raise JobFailed(outcome)
    return outcome.value


def _block_command(config: Config, jid: str, seconds: float) -> tuple[tuple[Any, ...], float]:
    """The rotation (it leaves the token in the list for the other waiters and
    the later ones) and its read timeout."""
    ready = results.ready_key(jid)
    # Whole milliseconds, never 0 (which would mean for ever); Redis 6+ takes decimals.
    block = max(round(seconds, 3), 0.001)
    return ("BRPOPLPUSH", ready, ready, block), block + config.redis_read_timeout


def _block(config: Config, jid: str, seconds: float) -> bool:
    """Wait up to ``seconds`` for the token; True if it came."""
    if stand_in is not None:
        raise ResultTimeout(jid, 0.0, stand_in(jid))  # testing mode: nothing runs meanwhile
    command, timeout = _block_command(config, jid, seconds)
    woke = runtime_for(config).wait_pool().run(lambda c: c.call(*command, timeout=timeout),
                                  idempotent=True)
    return woke is not None


async def _ablock(pool: AsyncRedisPool, config: Config, jid: str, seconds: float) -> bool:
    command, timeout = _block_command(config, jid, seconds)
    woke = await pool.run(lambda c: c.call(*command, timeout=timeout), idempotent=True)
    return woke is not None


@contextlib.asynccontextmanager
async def _async_waits(config: Config) -> AsyncIterator[AsyncRedisPool]:
    """The running loop's wait pool for ``config``, shared by the waits under way
    there and closed when the last one ends: an asyncio connection belongs to
    its loop, and one left open when ``asyncio.run`` closes the loop leaks."""
    waits = _async_waits_by_loop.setdefault(asyncio.get_running_loop(), {})
    entry = waits.get(id(config))
    if entry is None:
        settings = {**pool_settings(config), "size": WAIT_CONNECTIONS}
        entry = waits[id(config)] = _AsyncWaits(AsyncRedisPool(config.redis_url, **settings))
    entry.users += 1
    try:
        yield entry.pool
    finally:
        entry.users -= 1
        if not entry.users:
            waits.pop(id(config), None)
            with contextlib.suppress(Exception):  # the wait's answer stands either way
                await entry.pool.close()


@dataclass
class _AsyncWaits:
    pool: AsyncRedisPool
    users: int = 0

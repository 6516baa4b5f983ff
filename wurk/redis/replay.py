"""What a pool does after Redis trouble: the decisions both pools share, with no I/O.

The sync pool (:mod:`wurk.redis.pool`) and the asyncio pool
(:mod:`wurk.redis.apool`) each drive one :class:`Replay`, and do only their
own I/O (closing, sleeping, talking to Redis) around its verdicts.

Duties:
1. Hold what both pools share: retry settings, the ``on_redis_error`` hook,
   the drain's :class:`~wurk.redis.deadline.Deadline`, the jitter's rng, the
   count of disruptions (connections dropped for Redis trouble), and whether
   Redis ever answered (``answered``, which the pools set).
2. Judge a failed attempt of a block (:meth:`Replay.judge`): drop its
   connection or not, what the hook is told, and the pause before the
   replay or none to give up, from :func:`~wurk.redis.policy.retry_plan`,
   the retry backoff and the deadline; the same for a starved checkout
   (:meth:`Replay.starved`).
3. Read a config into the arguments both pools take (:func:`pool_settings`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import redis.exceptions as rx

from wurk.core.backoff import Backoff, Jitter
from wurk.core.logging import get_logger
from wurk.redis.deadline import Deadline
from wurk.redis.policy import ErrorKind, Plan, PoolExhausted, classify, retry_plan, trouble_backoff
from wurk.redis.sentinel import SentinelSettings
from wurk.settings.hooks import RedisErrorHook

if TYPE_CHECKING:
    from wurk.settings.config import Config

# Errors made of the server's own reply: whatever they say, Redis answered.
SERVER_REPLIES = (rx.ResponseError, rx.BusyLoadingError)
# The one pause before a starved checkout tries again: 50 to 100 ms.
CHECKOUT_PAUSE = Backoff(first=0.05, cap=0.05, jitter=Jitter.ADD, spread=1.0)


def report_default(error: BaseException, *, attempt: int, action: str) -> None:
    get_logger("wurk.redis").warning(
        "redis.error", action=action, attempt=attempt, error=f"{type(error).__name__}: {error}"
    )


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 4
    base: float = 0.5
    cap: float = 4.0
    checkout_timeout: float = 5.0

    @property
    def backoff(self) -> Backoff:
        """The pauses between replays of a block: ``delay(n)`` after failed attempt ``n``."""
        return trouble_backoff(self.base, self.cap)


class Verdict(NamedTuple):
    """What to do after an attempt of a block failed."""

    redial: bool          # drop the connection: the next attempt dials afresh
    action: str | None    # what the error hook is told; None: nothing (not Redis trouble)
    pause: float | None   # seconds to wait before the replay; None: raise the error


class Replay:
    """The retry decisions and bookkeeping of one pool."""

    def __init__(self, retry: RetrySettings | None = None, on_error: RedisErrorHook | None = None,
                 rng: random.Random | None = None) -> None:
        self.retry = retry or RetrySettings()
        self.on_error = on_error or report_default
        self.deadline = Deadline()
        self.disruptions = 0
        # Whether Redis ever replied to this pool, a refusal included: a push kept
        # for a Redis that never did is more likely a wrong URL than an outage
        # (wurk.push.nowhere). Kept in a forked child: the URL was proven.
        self.answered = False
        # None: the random module's, which Python reseeds in a forked child (one
        # Random() made here would give every child of a swarm the same jitter).
        self._rng = rng

    def note_disruption(self) -> None:
        # Unlocked: a lost increment still leaves the count changed.
        self.disruptions += 1

    def note_failure(self, error: BaseException) -> None:
        """Count a disruption if ``error`` dropped a connection for Redis trouble."""
        if classify(error) is not ErrorKind.OTHER:
            self.note_disruption()

    def judge(self, error: BaseException, attempt: int, max_attempts: int, *,
              idempotent: bool, dirty: bool) -> Verdict:
        """The verdict on attempt number ``attempt`` (1-based) of a block, which
        raised ``error``; ``dirty``: one of its round trips had completed."""
        kind = classify(error)
        if kind is ErrorKind.FAILOVER or isinstance(error, SERVER_REPLIES):
            self.answered = True  # READONLY, NOREPLICAS, LOADING: a refusal is an answer
        redial = kind is not ErrorKind.OTHER
        if redial:
            self.note_disruption()
        plan = retry_plan(kind, attempt, max_attempts, idempotent=idempotent, dirty=dirty)
        if plan is Plan.PROPAGATE:
            return Verdict(redial, None, None)
        if plan not in (Plan.FAILOVER, Plan.BACKOFF):
            return Verdict(redial, plan.value, None)
        pause = self.retry.backoff.delay(attempt, self._rng) if plan is Plan.BACKOFF else 0.0
        if not self.deadline.allows(pause):
            # The replay could only end after the drain's deadline.
            return Verdict(redial, "deadline", None)
        return Verdict(redial, "retry", pause)

    def report(self, error: BaseException, attempt: int, verdict: Verdict) -> None:
        """Tell the error hook what the verdict was (nothing when it was not Redis trouble)."""
        if verdict.action is not None:
            self.on_error(error, attempt=attempt, action=verdict.action)

    def checkout_timeout(self) -> float | None:
        """How long a checkout may wait for a connection to come free."""
        return self.deadline.clip(self.retry.checkout_timeout)

    def starved(self, error: PoolExhausted, attempt: int, tries: int) -> float | None:
        """Report checkout number ``attempt`` of ``tries`` that found no connection
        free; return the pause before the next one, or None to raise."""
        if attempt >= tries:
            self.on_error(error, attempt=attempt, action="give_up")
            return None
        self.on_error(error, attempt=attempt, action="retry")
        return CHECKOUT_PAUSE.delay(attempt, self._rng)


def pool_settings(config: Config) -> dict[str, Any]:
    """The pool arguments a config gives, but its URL (for the sync and the asyncio pool)."""
    return {
        "size": config.pool_size,
        "connect_timeout": config.redis_connect_timeout,
        "read_timeout": config.redis_read_timeout,
        "retry": RetrySettings(config.redis_retry_attempts, config.redis_retry_base,
                               config.redis_retry_cap),
        "on_error": config.on_redis_error,
        "sentinel": SentinelSettings.from_config(config),
    }

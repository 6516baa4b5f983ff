"""The apply-safety policy: which Redis failures may be replayed, and how.

redis-py, left to itself, re-sends a command after a read timeout. For a job
system that is a double push or a double-counted stat, so wurk's connections
run with redis-py's retries off and the pool asks this module, block by
block, whether running the caller's block again is provably safe.

Duties:
1. Classify a failure by when it happened (:func:`classify`): while dialing
   (nothing was sent), after a command may have reached Redis, or a refusal
   by a server that is no longer the primary.
2. Decide with :func:`retry_plan`, a pure function: replay after a dial
   failure or on an idempotent block with backoff and jitter up to a cap;
   one immediate reconnect-and-retry on READONLY/NOREPLICAS/UNBLOCKED; never
   replay a non-idempotent block once one of its round trips completed.
3. Space replays, and every other retry through Redis trouble, with
   :func:`trouble_backoff` (a :class:`~wurk.core.backoff.Backoff`).
4. Tell Redis trouble, which a caller may wait out and retry, from a defect
   of ours (a value that cannot be encoded, a bug) with :func:`redis_trouble`.
"""

from __future__ import annotations

import enum

import redis.exceptions as rx

from wurk.core.backoff import Backoff, Jitter
from wurk.redis.deadline import DeadlinePassed

# Replies that mean the server we reached is not (or no longer) the primary.
FAILOVER_PREFIXES = ("READONLY", "NOREPLICAS", "UNBLOCKED")
# What redis-py's Sentinel connections raise in place of a READONLY reply.
DEMOTED_MASTER = "The previous master is now a slave"


class ConnectError(rx.ConnectionError):
    """Raised while dialing or handshaking: no command of the block left us."""


class PoolExhausted(rx.ConnectionError):
    """No connection came free within the checkout timeout."""

class ErrorKind(enum.Enum):
    CONNECT = "connect"      # failed while dialing (or LOADING): provably unapplied
    IO = "io"                # failed after sending: outcome unknown
    FAILOVER = "failover"    # READONLY & co: the command was refused outright
    OTHER = "other"          # a real error reply or a bug: not ours to retry


class Plan(enum.Enum):
    FAILOVER = "failover"    # reconnect and retry at once
    BACKOFF = "backoff"      # reconnect after a pause and retry
    UNSAFE = "unsafe"        # may have applied: report and raise
    EXHAUSTED = "exhausted"  # replayable, but out of attempts: report and raise
    PROPAGATE = "propagate"  # not transient: raise untouched


def classify(error: BaseException) -> ErrorKind:
    if isinstance(error, rx.AuthenticationError | rx.AuthorizationError):
        return ErrorKind.OTHER
    if isinstance(error, ConnectError | DeadlinePassed | rx.BusyLoadingError):
        # LOADING (a restarted server still reading its data) refuses every
        # command it answers: as provably unapplied as a failed dial.
        return ErrorKind.CONNECT
    if isinstance(error, rx.ResponseError):
        failover = str(error).startswith(FAILOVER_PREFIXES) or isinstance(error, rx.ReadOnlyError)
        return ErrorKind.FAILOVER if failover else ErrorKind.OTHER
    if isinstance(error, rx.ConnectionError) and str(error) == DEMOTED_MASTER:
        return ErrorKind.FAILOVER
    if isinstance(error, rx.ConnectionError | rx.TimeoutError | OSError):
        return ErrorKind.IO
    return ErrorKind.OTHER


def redis_trouble(error: BaseException) -> bool:
    """Whether ``error`` came from Redis or the way to it, so that waiting and
    sending again may cure it: anything redis-py raises (an outage, a refusal,
    a script error) or the socket does (OSError, the builtin timeouts), but
    not a DataError, a value redis-py cannot encode, which is ours."""
    if isinstance(error, rx.DataError):
        return False
    return isinstance(error, rx.RedisError | OSError)


def retry_plan(kind: ErrorKind, attempt: int, max_attempts: int, *,
               idempotent: bool, dirty: bool) -> Plan:
    """What to do after attempt number ``attempt`` (1-based) failed.

    ``dirty`` means an earlier round trip of this block completed, so some
    of its commands certainly applied.
    """
    if kind is ErrorKind.OTHER:
        return Plan.PROPAGATE
    replayable = idempotent or (not dirty and kind in (ErrorKind.CONNECT, ErrorKind.FAILOVER))
    if not replayable:
        return Plan.UNSAFE
    if kind is ErrorKind.FAILOVER:
        return Plan.FAILOVER if attempt == 1 else Plan.EXHAUSTED
    return Plan.BACKOFF if attempt < max_attempts else Plan.EXHAUSTED


# The shortest wait between tries through trouble (``redis_retry_base`` may be
# 0): a refused dial returns at once, and a retry loop must not spin on it.
SHORTEST_WAIT = 0.01


def trouble_backoff(base: float, cap: float) -> Backoff:
    """The wait between tries through Redis trouble: ``base`` doubling up to
    ``cap``, plus up to half again of jitter so that a fleet which lost Redis
    together does not come back in step."""
    return Backoff(first=base, cap=cap, jitter=Jitter.ADD, spread=0.5)

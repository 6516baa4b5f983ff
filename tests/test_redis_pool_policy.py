"""Unit tests of the pool's apply-safety policy: pure functions against hand-written tables.

``classify`` sorts an exception into a kind, ``retry_plan`` decides what to do
after each failed attempt, ``trouble_backoff`` says how long to wait. Nothing
here sleeps or touches Redis. ``RedisPool.run`` itself is tested in
test_redis_pool_run.py, the pool across fork in test_redis_pool_fork.py.
"""

from __future__ import annotations

import random

import pytest
import redis.exceptions as rx
from draws import FixedRng

from wurk.redis.policy import (
    ConnectError,
    ErrorKind,
    Plan,
    PoolExhausted,
    classify,
    retry_plan,
    trouble_backoff,
)


@pytest.mark.parametrize(("error", "kind"), [
    (ConnectError("cannot connect"), ErrorKind.CONNECT),
    (rx.ConnectionError("Connection closed by server."), ErrorKind.IO),
    (rx.TimeoutError("Timeout reading from socket"), ErrorKind.IO),
    (TimeoutError("timed out"), ErrorKind.IO),
    (ConnectionResetError(104, "reset"), ErrorKind.IO),
    (BrokenPipeError(32, "broken pipe"), ErrorKind.IO),
    (OSError("network is unreachable"), ErrorKind.IO),
    # LOADING is a refusal (nothing ran), not a lost reply: replayable like a failed dial.
    (rx.BusyLoadingError("Redis is loading the dataset in memory"), ErrorKind.CONNECT),
    (PoolExhausted("no Redis connection free"), ErrorKind.IO),
    (rx.ResponseError("READONLY You can't write against a read only replica."),
     ErrorKind.FAILOVER),
    # redis-py strips the code off the message of the class it maps READONLY to.
    (rx.ReadOnlyError("You can't write against a read only replica."), ErrorKind.FAILOVER),
    (rx.ResponseError("NOREPLICAS Not enough good replicas to write."), ErrorKind.FAILOVER),
    (rx.ResponseError("UNBLOCKED force unblock from blocking operation"), ErrorKind.FAILOVER),
    (rx.ResponseError("readonly lower case is not the server's code"), ErrorKind.OTHER),
    (rx.ResponseError("ERR READONLY only counts as a prefix"), ErrorKind.OTHER),
    (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
     ErrorKind.OTHER),
    (rx.ResponseError("ERR unknown command"), ErrorKind.OTHER),
    (rx.ExecAbortError("Transaction discarded because of previous errors."), ErrorKind.OTHER),
    (rx.NoScriptError("No matching script."), ErrorKind.OTHER),
    (rx.AuthenticationError("invalid username-password pair"), ErrorKind.OTHER),
    (rx.AuthorizationError("not allowed"), ErrorKind.OTHER),
    (rx.DataError("Invalid input of type: 'dict'"), ErrorKind.OTHER),
    (ValueError("a bug in the block"), ErrorKind.OTHER),
    (KeyError("job"), ErrorKind.OTHER),
])
def test_classify(error: BaseException, kind: ErrorKind) -> None:
    assert classify(error) is kind


B, E, F, U, P = Plan.BACKOFF, Plan.EXHAUSTED, Plan.FAILOVER, Plan.UNSAFE, Plan.PROPAGATE


# (kind, idempotent, dirty) -> plan after attempt 1..5 failed, with max_attempts=4.
PLANS: dict[tuple[ErrorKind, bool, bool], tuple[Plan, ...]] = {
    # A dial failure sent nothing: replay unless an earlier round trip applied.
    (ErrorKind.CONNECT, False, False): (B, B, B, E, E),
    (ErrorKind.CONNECT, False, True): (U, U, U, U, U),
    (ErrorKind.CONNECT, True, False): (B, B, B, E, E),
    (ErrorKind.CONNECT, True, True): (B, B, B, E, E),
    # After sending, the outcome is unknown: only idempotent blocks replay.
    (ErrorKind.IO, False, False): (U, U, U, U, U),
    (ErrorKind.IO, False, True): (U, U, U, U, U),
    (ErrorKind.IO, True, False): (B, B, B, E, E),
    (ErrorKind.IO, True, True): (B, B, B, E, E),
    # A refusal applied nothing: one immediate retry, then give up (reported).
    (ErrorKind.FAILOVER, False, False): (F, E, E, E, E),
    (ErrorKind.FAILOVER, False, True): (U, U, U, U, U),
    (ErrorKind.FAILOVER, True, False): (F, E, E, E, E),
    (ErrorKind.FAILOVER, True, True): (F, E, E, E, E),
    # Real error replies and bugs are never ours to retry.
    (ErrorKind.OTHER, False, False): (P, P, P, P, P),
    (ErrorKind.OTHER, False, True): (P, P, P, P, P),
    (ErrorKind.OTHER, True, False): (P, P, P, P, P),
    (ErrorKind.OTHER, True, True): (P, P, P, P, P),
}


PLAN_CASES = [
    pytest.param(kind, idem, dirty, attempt, plans[attempt - 1],
                 id=f"{kind.value}-{'idem' if idem else 'once'}-"
                    f"{'dirty' if dirty else 'clean'}-attempt{attempt}")
    for (kind, idem, dirty), plans in PLANS.items()
    for attempt in range(1, 6)
]


def test_plan_table_covers_every_combination() -> None:
    assert set(PLANS) == {(k, i, d) for k in ErrorKind for i in (False, True)
                          for d in (False, True)}


@pytest.mark.parametrize(("kind", "idempotent", "dirty", "attempt", "plan"), PLAN_CASES)
def test_retry_plan(kind: ErrorKind, idempotent: bool, dirty: bool, attempt: int,
                    plan: Plan) -> None:
    assert retry_plan(kind, attempt, 4, idempotent=idempotent, dirty=dirty) is plan


@pytest.mark.parametrize(("kind", "plan"), [
    (ErrorKind.CONNECT, Plan.EXHAUSTED),
    (ErrorKind.IO, Plan.EXHAUSTED),
    (ErrorKind.FAILOVER, Plan.FAILOVER),  # the failover retry is its own budget
    (ErrorKind.OTHER, Plan.PROPAGATE),
])
def test_retry_plan_with_a_single_attempt(kind: ErrorKind, plan: Plan) -> None:
    assert retry_plan(kind, 1, 1, idempotent=True, dirty=False) is plan


@pytest.mark.parametrize(("attempt", "delay"), [
    (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (6, 4.0), (30, 4.0),
])
def test_backoff_is_exponential_and_capped(attempt: int, delay: float) -> None:
    assert trouble_backoff(0.5, 4.0).delay(attempt, FixedRng(0.0)) == pytest.approx(delay)
    # Jitter adds up to half the delay, never more, never less than nothing.
    assert trouble_backoff(0.5, 4.0).delay(attempt, FixedRng(0.5)) == pytest.approx(delay * 1.25)
    assert trouble_backoff(0.5, 4.0).delay(attempt, FixedRng(0.999999)) == pytest.approx(
        delay * 1.5, rel=1e-5)


def test_backoff_jitter_stays_within_bounds_and_varies() -> None:
    rng = random.Random(0)
    for attempt in range(1, 8):
        floor = min(2.0, 0.1 * 2 ** (attempt - 1))
        samples = [trouble_backoff(0.1, 2.0).delay(attempt, rng) for _ in range(200)]
        assert all(floor <= s <= floor * 1.5 for s in samples)
        assert len(set(samples)) > 100  # jittered, so a fleet does not retry in step


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    first = [trouble_backoff(0.5, 4.0).delay(a, random.Random(7)) for a in range(1, 5)]
    again = [trouble_backoff(0.5, 4.0).delay(a, random.Random(7)) for a in range(1, 5)]
    assert first == again

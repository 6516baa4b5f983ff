"""The one backoff policy (wurk.core.backoff) and the sites that use it.

1. Properties of :class:`Backoff`, with hypothesis: without jitter the delay
   grows monotonically up to the cap; with jitter it stays within the
   policy's bounds; the cap holds; a delay is never negative or infinite,
   however many failures are counted; it is the same given the same random
   source, and an unjittered policy draws nothing from it.
2. Each site keeps its numbers: the delays its old formula gave, written out
   here once, for the same draws.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time

import pytest
from draws import FixedRng
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.children import BACKOFF_BASE, SlotState
from supervisor.topology import Slot
from tests.conftest import free_port
from tests.periodic_support import entries
from wurk.core.backoff import Backoff, Jitter
from wurk.limiter.policy import POLL_MAX, POLL_MIN, poll_pause
from wurk.push.buffered import DRAIN_BACKOFF
from wurk.redis.policy import trouble_backoff
from wurk.redis.pool import RetrySettings
from wurk.redis.replay import CHECKOUT_PAUSE
from wurk.redis.runtime import close_runtime
from wurk.redis.wait import PAUSES
from wurk.runtime.leader import Leader
from wurk.runtime.leader_policy import ERROR_PAUSE_FIRST, error_pause
from wurk.runtime.periodic import MAX_BACKOFF, PeriodicLoop
from wurk.settings.config import Config

seconds = st.floats(0, 3600, allow_nan=False)
factors = st.floats(1, 10, allow_nan=False)
spreads = st.floats(0, 1, allow_nan=False)
attempts = st.integers(-3, 200) | st.integers(10**6, 10**30)
draws = st.floats(0, 1, exclude_max=True)
policies = st.builds(Backoff, first=seconds, cap=seconds, factor=factors,
                     jitter=st.sampled_from(Jitter), spread=spreads)
unjittered = st.builds(Backoff, first=seconds, cap=seconds, factor=factors)
# Pure and quick, but a busy 2-core machine must not turn a pause into a failure.
relaxed = settings(deadline=None, database=None)


# -- properties ----------------------------------------------------------------------------

@relaxed
@given(unjittered, st.integers(1, 300), st.integers(0, 300))
def test_without_jitter_the_delay_grows_monotonically_up_to_the_cap(
        policy: Backoff, attempt: int, more: int) -> None:
    assert policy.delay(attempt) <= policy.delay(attempt + more) <= policy.cap
    expected = min(policy.cap, policy.first * policy.factor ** min(attempt - 1, 2000))
    assert policy.delay(attempt) == pytest.approx(expected)


@relaxed
@given(policies, attempts, draws)
def test_with_jitter_the_delay_stays_within_the_bounds(
        policy: Backoff, attempt: int, draw: float) -> None:
    low, high = policy.bounds(attempt)
    assert low <= policy.delay(attempt, FixedRng(draw)) <= high
    assert low <= policy.nominal(attempt) <= high
    for edge in (0.0, math.nextafter(1.0, 0.0)):
        assert low <= policy.delay(attempt, FixedRng(edge)) <= high


@relaxed
@given(policies, attempts, draws)
def test_the_cap_holds_before_jitter_and_jitter_moves_it_by_the_spread_at_most(
        policy: Backoff, attempt: int, draw: float) -> None:
    assert policy.nominal(attempt) <= policy.cap
    ceiling = policy.cap * (1 if policy.jitter in (Jitter.NONE, Jitter.SUBTRACT)
                            else 1 + policy.spread)
    assert policy.delay(attempt, FixedRng(draw)) <= ceiling * (1 + 1e-12)


@relaxed
@given(policies, attempts, st.integers(0, 2**32))
def test_a_delay_is_never_negative_nor_infinite(policy: Backoff, attempt: int,
                                                seed: int) -> None:
    delay = policy.delay(attempt, random.Random(seed))
    assert 0 <= delay < math.inf
    if attempt < 1:
        assert delay == 0  # no failure yet, no wait


@relaxed
@given(policies, st.lists(attempts, max_size=10), st.integers(0, 2**32))
def test_the_same_random_source_gives_the_same_delays(
        policy: Backoff, tries: list[int], seed: int) -> None:
    first, again = random.Random(seed), random.Random(seed)
    assert [policy.delay(a, first) for a in tries] == [policy.delay(a, again) for a in tries]


@relaxed
@given(unjittered, attempts, st.integers(0, 2**32))
def test_an_unjittered_policy_draws_nothing(policy: Backoff, attempt: int, seed: int) -> None:
    rng = random.Random(seed)
    state = rng.getstate()
    policy.delay(attempt, rng)
    assert rng.getstate() == state  # a shared source (the retry's own) is left as it was


@relaxed
@given(policies, st.integers(0, 40), st.integers(0, 2**32))
def test_increment_and_reset_return_new_values(policy: Backoff, times: int, seed: int) -> None:
    counted = policy
    for _ in range(times):
        counted = counted.increment()
    assert (policy.failures, counted.failures) == (0, times)
    assert counted.pause(random.Random(seed)) == policy.delay(times, random.Random(seed))
    assert counted.reset() == policy
    with pytest.raises(dataclasses.FrozenInstanceError):
        counted.failures = 0  # type: ignore[misc]


@pytest.mark.parametrize("bad", [
    {"first": -1.0}, {"cap": math.nan}, {"cap": math.inf}, {"first": True},
    {"factor": 0.5}, {"spread": 1.5}, {"spread": -0.1}, {"failures": -1},
])
def test_a_policy_that_makes_no_sense_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**{"first": 1.0, "cap": 2.0, **bad})  # type: ignore[arg-type]


def test_without_a_random_source_the_draw_is_the_random_modules() -> None:
    # The module's source is reseeded in a forked child; a Random() made in
    # the parent would give every child the same jitter.
    policy = Backoff(first=1.0, cap=1.0, jitter=Jitter.AROUND, spread=0.5)
    saved = random.getstate()
    try:
        random.seed(5)
        drawn = [policy.delay(1) for _ in range(3)]
    finally:
        random.setstate(saved)
    assert drawn == [policy.delay(1, rng) for rng in [random.Random(5)] for _ in range(3)]


# -- each site keeps its numbers ---------------------------------------------------------

@relaxed
@given(st.integers(1, 60), draws, st.sampled_from([(0.5, 4.0), (0.01, 0.05), (60.0, 0.01)]))
def test_redis_trouble_keeps_its_delays(attempt: int, draw: float,
                                        base_cap: tuple[float, float]) -> None:
    base, cap = base_cap
    nominal = min(cap, base * (2 ** (attempt - 1)))
    old = nominal + draw * nominal * 0.5
    assert trouble_backoff(base, cap).delay(attempt, FixedRng(draw)) == pytest.approx(old)
    assert RetrySettings(4, base, cap).backoff == trouble_backoff(base, cap)


@relaxed
@given(draws)
def test_a_starved_checkout_still_waits_50_to_100_ms(draw: float) -> None:
    assert CHECKOUT_PAUSE.delay(1, FixedRng(draw)) == pytest.approx(0.05 + draw * 0.05)


@relaxed
@given(st.integers(1, 200), draws, st.floats(1.0, 86_400.0))
def test_a_leaders_error_pause_keeps_its_delays(failures: int, draw: float, ttl: float) -> None:
    old = min(ttl / 6, ERROR_PAUSE_FIRST * 2.0 ** min(failures - 1, 30)) * (0.75 + draw / 2)
    assert error_pause(failures, ttl, FixedRng(draw)) == pytest.approx(old)


@relaxed
@given(st.integers(1, 200), draws)
def test_a_limiters_poll_keeps_its_delays(attempt: int, draw: float) -> None:
    ceiling = min(POLL_MAX, POLL_MIN * float(2 ** min(attempt - 1, 10)))
    old = ceiling / 2 + draw * ceiling / 2
    assert poll_pause(attempt, None, FixedRng(draw)) == pytest.approx(old)


def test_the_wait_for_redis_and_the_respawn_keep_their_documented_delays() -> None:
    for attempt in range(1, 40):
        assert PAUSES.delay(attempt) == min(10.0, 0.5 * 2 ** (attempt - 1))
    state = SlotState(Slot("web", 1, Config()), 1)
    for crashes in range(40):
        state.crashes = crashes
        before = time.monotonic()
        state.schedule_respawn(30.0)
        after = time.monotonic()
        # What the supervise loop reads (next_spawn_at) against the old formula.
        old = min(30.0, BACKOFF_BASE * 2 ** (crashes - 1)) if crashes else 0.0
        assert before + old <= state.next_spawn_at <= after + old


@relaxed
@given(st.integers(1, 60), draws)
def test_client_push_retries_take_the_redis_trouble_jitter(failures: int, draw: float) -> None:
    # Unjittered before: 0.1 s doubling to 2 s. Now the same floor, up to half again.
    floor = min(2.0, 0.1 * 2 ** (failures - 1))
    assert floor <= DRAIN_BACKOFF.delay(failures, FixedRng(draw)) <= floor * 1.5


@pytest.mark.parametrize("interval", [0.05, 1.0])
def test_a_failing_periodic_pass_keeps_its_pauses(interval: float) -> None:
    # A Redis that refuses every dial: each pass fails, for real.
    config = Config(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_retry_attempts=1,
                    log_level="warning")
    loop = PeriodicLoop(config, entries(), lease=Leader("periodic", ttl=2.0, config=config),
                        interval=interval)
    try:
        pauses = []
        for failures in range(1, 13):  # as the loop's service calls its pass and its failed hook
            with pytest.raises(Exception) as failed:
                loop._pass()
            pauses.append(loop._failed(failed.value, failures))
    finally:
        close_runtime(config)
    assert pauses == [min(MAX_BACKOFF, interval * 2 ** min(n, 8)) for n in range(1, 13)]

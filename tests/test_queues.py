"""Queue specs and the order a fetch polls them in."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from wurk.settings.bounds import MAX_QUEUE_WEIGHT
from wurk.settings.queues import QueuePlan, QueueSpecError, parse_queue, parse_queues

DRAWS = 6000


Orders = Counter[tuple[str, ...]]


def first_counts(specs: list[str], seed: int = 1234) -> tuple[Counter[str], Orders]:
    plan = parse_queues(specs)
    rng = random.Random(seed)
    firsts: Counter[str] = Counter()
    orders: Orders = Counter()
    for _ in range(DRAWS):
        order = plan.order(rng)
        firsts[order[0]] += 1
        orders[tuple(order)] += 1
    return firsts, orders


# -- strict ------------------------------------------------------------------


def test_strict_order_is_kept() -> None:
    plan = parse_queues(["critical", "default", "low"])
    assert plan.strict
    rng = random.Random(7)
    for _ in range(200):
        assert plan.order(rng) == ["critical", "default", "low"]
    assert plan.order() == ["critical", "default", "low"]
    assert plan.weights() == {"critical": 1, "default": 1, "low": 1}


def test_strict_order_is_deduplicated() -> None:
    plan = parse_queues(["a", "b", "a", "c", "b"])
    assert plan.names == ("a", "b", "c")
    assert plan.order() == ["a", "b", "c"]


def test_order_returns_a_fresh_list() -> None:
    plan = parse_queues(["a", "b"])
    plan.order().append("zzz")
    assert plan.order() == ["a", "b"]


def test_all_zero_weights_are_strict() -> None:
    # Sidekiq (6.4 CLI, 8.x capsules): weights that are all 0 mean strict order.
    plan = parse_queues(["a:0", "b:0", "c"])
    assert plan.strict
    assert all(plan.order(random.Random(s)) == ["a", "b", "c"] for s in range(50))


# -- weighted ----------------------------------------------------------------


def test_weighted_two_queues_frequencies() -> None:
    firsts, orders = first_counts(["critical:3", "default:1"])
    assert set(orders) == {("critical", "default"), ("default", "critical")}
    assert firsts["critical"] > 2 * firsts["default"]
    # The first element of a shuffled multiset is each copy with equal chance: 3/4.
    assert firsts["critical"] / DRAWS == pytest.approx(0.75, abs=0.03)


def test_weighted_three_queues_every_order_appears() -> None:
    firsts, orders = first_counts(["a:3", "b:2", "c:1"])
    assert set(orders) == set(itertools.permutations("abc"))
    assert firsts["a"] > firsts["b"] > firsts["c"] > 0
    for name, share in (("a", 3 / 6), ("b", 2 / 6), ("c", 1 / 6)):
        assert firsts[name] / DRAWS == pytest.approx(share, abs=0.03)


def test_weighted_order_is_deduplicated_and_complete() -> None:
    plan = parse_queues(["a:5", "b:2", "a:1", "c:1"])
    assert not plan.strict
    assert plan.names == ("a", "b", "c")
    assert plan.weights() == {"a": 6, "b": 2, "c": 1}
    rng = random.Random(99)
    for _ in range(300):
        order = plan.order(rng)
        assert sorted(order) == ["a", "b", "c"]


def test_equal_weights_are_random() -> None:
    firsts, orders = first_counts(["x:1", "y:1"], seed=5)
    assert not parse_queues(["x:1", "y:1"]).strict
    assert len(orders) == 2
    assert firsts["x"] / DRAWS == pytest.approx(0.5, abs=0.03)


def test_weighted_order_is_reproducible_with_a_seed() -> None:
    plan = parse_queues(["a:2", "b:3", "c:1"])
    first = [plan.order(random.Random(42)) for _ in range(5)]
    again = [plan.order(random.Random(42)) for _ in range(5)]
    assert first == again


def test_weight_zero_queue_is_still_polled() -> None:
    plan = parse_queues(["busy:4", "idle:0"])
    assert not plan.strict
    assert plan.weights() == {"busy": 4, "idle": 1}
    rng = random.Random(3)
    assert all("idle" in plan.order(rng) for _ in range(100))


def test_unweighted_queue_among_weighted_counts_once() -> None:
    plan = parse_queues(["a:3", "b"])
    assert not plan.strict
    assert plan.weights() == {"a": 3, "b": 1}


def test_order_uses_global_random_without_rng() -> None:
    plan = parse_queues(["a:1", "b:1"])
    seen = {tuple(plan.order()) for _ in range(200)}
    assert seen == {("a", "b"), ("b", "a")}


def test_order_costs_nothing_per_unit_of_weight() -> None:
    # Weights are never expanded into a list: a weight of 10**12 costs what 1 does.
    plan = QueuePlan(names=("huge", "tiny"), weight_of=(10**12, 1), strict=False)
    rng = random.Random(11)
    firsts = Counter(plan.order(rng)[0] for _ in range(DRAWS))
    assert firsts["huge"] >= DRAWS - 1
    assert sorted(plan.order(rng)) == ["huge", "tiny"]


def test_the_heaviest_weight_allowed_is_parsed_and_ordered() -> None:
    plan = parse_queues([f"a:{MAX_QUEUE_WEIGHT}", "b:1", f"a:{MAX_QUEUE_WEIGHT}"])
    assert plan.weights() == {"a": 2 * MAX_QUEUE_WEIGHT, "b": 1}
    firsts, _ = first_counts([f"a:{MAX_QUEUE_WEIGHT}", "b:1"])
    assert firsts["b"] / DRAWS == pytest.approx(1 / (MAX_QUEUE_WEIGHT + 1), abs=0.003)


# -- parsing -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("low", ("low", None)),
        ("  low  ", ("low", None)),
        ("critical:3", ("critical", 3)),
        ("critical,3", ("critical", 3)),
        ("critical : 3", ("critical", 3)),
        ("idle:0", ("idle", 0)),
        ("mail.high:2", ("mail.high", 2)),
    ],
)
def test_parse_queue(spec: str, expected: tuple[str, int | None]) -> None:
    assert parse_queue(spec) == expected


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "empty queue name"),
        ("   ", "empty queue name"),
        (":3", "empty queue name"),
        (",2", "empty queue name"),
        ("a:x", "non-integer weight"),
        ("a:", "non-integer weight"),
        ("a:1.5", "non-integer weight"),
        ("a:-1", "negative weight"),
        ("a:--1", "non-integer weight"),
        ("a:1_000", "non-integer weight"),
        (f"a:{MAX_QUEUE_WEIGHT + 1}", f"weight above {MAX_QUEUE_WEIGHT}"),
        ("a:100000000000", f"weight above {MAX_QUEUE_WEIGHT}"),
    ],
)
def test_parse_queue_errors(spec: str, why: str) -> None:
    with pytest.raises(QueueSpecError) as err:
        parse_queue(spec)
    assert why in str(err.value)
    assert repr(spec) in str(err.value)


def test_parse_queues_errors() -> None:
    with pytest.raises(QueueSpecError, match="is empty"):
        parse_queues([])
    with pytest.raises(QueueSpecError, match="non-integer weight in 'b:x'"):
        parse_queues(["a", "b:x"])
    assert issubclass(QueueSpecError, ValueError)

"""Failure handling: the retry delay, backtraces, the retry set and the morgue (spec §6, §7)."""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Mapping
from typing import Any

import pytest
import redis
from tuning import tuned

from wurk.core.threads import describe
from wurk.push.options import make_options
from wurk.redis.runtime import runtime_for
from wurk.runtime.retry import (
    MAX_MESSAGE,
    UNREADABLE_MESSAGE,
    RetryHandler,
    UnusableCountError,
    backtrace_limit,
    decode_backtrace,
    encode_backtrace,
    exception_message,
    kill,
    next_retry_count,
    retry_delay,
)
from wurk.settings.config import Config
from wurk.wire.payload import new_jid


class Boom(RuntimeError):
    pass


def make_job(**extra: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "retry": True, "queue": "default", "class": "RetryTestJob", "args": [1, "two"],
        "jid": new_jid(), "created_at": time.time() - 5, "enqueued_at": time.time() - 1,
    }
    job.update(extra)
    return job


def raised(exc: BaseException) -> BaseException:
    """The exception with a real traceback attached, as a job would leave it."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def entries(r: redis.Redis, key: str) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(m), s) for m, s in r.zrange(key, 0, -1, withscores=True)]


def only_entry(r: redis.Redis, key: str) -> tuple[dict[str, Any], float]:
    found = entries(r, key)
    assert len(found) == 1, found
    return found[0]


def pop_retry(r: redis.Redis) -> dict[str, Any]:
    """What the poller does before the job runs again: take the entry out."""
    popped = r.zpopmin("retry")
    assert popped, "expected a retry entry"
    return dict(json.loads(popped[0][0]))


@pytest.fixture
def handler(config: Config) -> RetryHandler:
    return RetryHandler(config, rng=random.Random(42))


# -- the delay formula -----------------------------------------------------------------


@pytest.mark.parametrize("count", range(6))
def test_retry_delay_bounds(count: int) -> None:
    rng = random.Random(count * 1000 + 7)
    base = count**4 + 15
    samples = [retry_delay(count, rng) for _ in range(400)]
    assert all(base <= d < base + 10 * (count + 1) for d in samples)
    # The jitter really varies: both ends of the range show up.
    assert min(samples) == base
    assert max(samples) >= base + 8 * (count + 1)


def test_retry_delay_is_deterministic_for_a_seed() -> None:
    a = [retry_delay(c, random.Random(5)) for c in range(6)]
    b = [retry_delay(c, random.Random(5)) for c in range(6)]
    assert a == b


@pytest.mark.parametrize("count", [0, 3, 5])
def test_a_custom_delay_is_the_delay_with_no_jitter_added(count: int) -> None:
    rng = random.Random(3)
    assert {retry_delay(count, rng, 100) for _ in range(200)} == {100}
    assert retry_delay(count, rng, 1.5) == 1.5


def test_non_positive_custom_delay_falls_back_to_the_formula() -> None:
    for custom in (None, 0, -5):
        d = retry_delay(2, random.Random(1), custom)
        assert 2**4 + 15 <= d < 2**4 + 15 + 30


# -- backtraces --------------------------------------------------------------------------


def test_backtrace_round_trip_and_zlib_header() -> None:
    lines = ["app/jobs.py:10:in `perform'", "wurk/processor.py:77:in `_run'", "ünïcode:1:in `x'"]
    encoded = encode_backtrace(lines)
    assert encoded.startswith("eJ")
    assert decode_backtrace(encoded) == lines
    # Ruby 6.x-7.2 write Base64.encode64 (a newline every 60 chars): still decodes.
    wrapped = "\n".join(encoded[i:i + 60] for i in range(0, len(encoded), 60)) + "\n"
    assert decode_backtrace(wrapped) == lines
    base64.b64decode(encoded, validate=True)  # strict base64, no newlines


# -- reading what a payload carries -------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), (False, None),      # Sidekiq's `if msg["retry_count"]`: a first failure
    (0, 1), (24, 25), (-1, 0),        # -1: a job retried by hand from a count of 0
    (3.0, 4), (2**53 - 1, 2**53),
])
def test_next_retry_count(value: Any, expected: int | None) -> None:
    assert next_retry_count(value) == expected


@pytest.mark.parametrize("value", ["abc", "3", True, 2.5, 1e300, -(2**53), [1], {"n": 1}])
def test_next_retry_count_refuses_what_is_not_a_count(value: Any) -> None:
    with pytest.raises(UnusableCountError, match="is not a count"):
        next_retry_count(value)


@pytest.mark.parametrize(("value", "expected"), [
    (True, None), (5, 5), (-2, -2), (2.9, 2),
    # Ruby's String#to_i, as Sidekiq 6.4 applies it: the leading integer, else 0.
    ("abc", 0), ("12abc", 12), (" -3", -3), ("9" * 5000, 999_999_999_999_999_999),
    ([3], 0), ({"a": 1}, 0),
])
def test_backtrace_limit_reads_any_value(value: Any, expected: int | None) -> None:
    assert backtrace_limit(value) == expected


def test_an_unreadable_message_is_replaced_as_sidekiq_does() -> None:
    class Unreadable(Exception):
        def __str__(self) -> str:
            raise KeyboardInterrupt

    assert exception_message(Unreadable()) == UNREADABLE_MESSAGE
    assert describe(Unreadable()) == "Unreadable: (its message raised an error)"
    assert exception_message(ValueError("bad \udcff byte")) == "bad ? byte"


def test_unusable_retry_count_goes_to_dead_with_the_reason(
        r: redis.Redis, config: Config, handler: RetryHandler) -> None:
    died: list[str] = []
    config.death_handlers.append(lambda job, exc: died.append(job["jid"]))
    job = make_job(retry_count="abc", dead=False)  # dead: false drops exhausted jobs, not these
    assert handler.handle(job, "default", raised(Boom("kaput")), None) == "dead"
    entry, _ = only_entry(r, "dead")
    assert entry["error_message"] == ("kaput (wurk: retry_count 'abc' is not a count, "
                                      "so the job went to dead)")
    assert entry["retry_count"] == 0  # a retry from the morgue can count from here
    assert isinstance(entry["failed_at"], float)
    assert died == [job["jid"]]
    assert r.zcard("retry") == 0


def test_a_custom_delay_that_is_not_finite_falls_back_to_the_formula(
        r: redis.Redis, handler: RetryHandler) -> None:
    before = time.time()
    options = make_options(retry_in=lambda c, e, j: 10**400)
    assert handler.handle(make_job(), "default", raised(Boom("x")), options) == "retry"
    _, at = only_entry(r, "retry")
    assert before + 15 <= at <= time.time() + 24


# -- RetryHandler against real Redis ------------------------------------------------------


def test_first_failure_writes_a_retry_entry(r: redis.Redis, handler: RetryHandler) -> None:
    job = make_job(bid="b-123", tags=["x"])
    before = time.time()
    outcome = handler.handle(job, "default", raised(Boom("kaput")), None)
    after = time.time()
    assert outcome == "retry"
    entry, at = only_entry(r, "retry")
    assert entry["error_message"] == "kaput"
    assert entry["error_class"] == "Boom"
    assert isinstance(entry["failed_at"], float)
    assert before <= entry["failed_at"] <= after
    assert entry["retry_count"] == 0
    assert "retried_at" not in entry
    assert entry["queue"] == "default"
    assert "error_backtrace" not in entry
    # Everything else survives untouched.
    for key in ("jid", "class", "args", "created_at", "enqueued_at", "bid", "tags", "retry"):
        assert entry[key] == job[key]
    assert before + 15 <= at <= after + 24
    assert r.zcard("dead") == 0


def test_second_failure_increments_and_keeps_failed_at(r: redis.Redis,
                                                      handler: RetryHandler) -> None:
    handler.handle(make_job(), "default", raised(Boom("one")), None)
    first = pop_retry(r)
    before = time.time()
    assert handler.handle(first, "default", raised(ValueError("two")), None) == "retry"
    after = time.time()
    entry, at = only_entry(r, "retry")
    assert entry["retry_count"] == 1
    assert isinstance(entry["retried_at"], float)
    assert before <= entry["retried_at"] <= after
    assert entry["failed_at"] == first["failed_at"]
    assert entry["error_message"] == "two"
    assert entry["error_class"] == "ValueError"
    # count 1: 1 + 15 + rand(10) * 2
    assert before + 16 <= at <= after + 16 + 18


def test_retry_zero_goes_straight_to_dead(r: redis.Redis, handler: RetryHandler) -> None:
    outcome = handler.handle(make_job(retry=0), "default", raised(Boom("x")), None)
    assert outcome == "dead"
    assert r.zcard("retry") == 0
    entry, at = only_entry(r, "dead")
    assert entry["retry_count"] == 0
    assert isinstance(entry["failed_at"], float)
    assert abs(at - time.time()) < 5


@pytest.mark.parametrize("limit", [1, 3])
def test_retry_n_dies_after_n_plus_one_executions(r: redis.Redis, handler: RetryHandler,
                                                  limit: int) -> None:
    job = make_job(retry=limit)
    outcomes = []
    for _ in range(limit + 1):
        outcomes.append(handler.handle(job, "default", raised(Boom("again")), None))
        if outcomes[-1] == "retry":
            job = pop_retry(r)
    assert outcomes == ["retry"] * limit + ["dead"]
    entry, _ = only_entry(r, "dead")
    assert entry["retry_count"] == limit
    assert r.zcard("retry") == 0


def test_default_retry_uses_max_retries(r: redis.Redis, config: Config,
                                        handler: RetryHandler) -> None:
    config = tuned(config, max_retries=2)
    handler = RetryHandler(config, rng=random.Random(42))
    job = make_job(retry=True)
    outcomes = []
    for _ in range(3):
        outcomes.append(handler.handle(job, "default", raised(Boom("x")), None))
        if outcomes[-1] == "retry":
            job = pop_retry(r)
    assert outcomes == ["retry", "retry", "dead"]


def test_retry_false_leaves_no_trace_but_runs_death_handlers(
        r: redis.Redis, config: Config, handler: RetryHandler) -> None:
    died: list[tuple[Mapping[str, Any], BaseException]] = []
    config.death_handlers.append(lambda job, exc: died.append((job, exc)))
    job = make_job(retry=False)
    exc = raised(Boom("nope"))
    assert handler.handle(job, "default", exc, None) == "dropped"
    assert r.zcard("retry") == 0
    assert r.zcard("dead") == 0
    assert len(died) == 1
    assert died[0][0]["jid"] == job["jid"]
    assert died[0][1] is exc


def test_dead_false_drops_on_exhaustion(r: redis.Redis, config: Config,
                                        handler: RetryHandler) -> None:
    died: list[str] = []
    config.death_handlers.append(lambda job, exc: died.append(job["jid"]))
    job = make_job(retry=0, dead=False)
    assert handler.handle(job, "default", raised(Boom("x")), None) == "dropped"
    assert r.zcard("dead") == 0
    assert r.zcard("retry") == 0
    assert died == [job["jid"]]


def test_dead_false_from_options(r: redis.Redis, handler: RetryHandler) -> None:
    options = make_options(retry=0, dead=False)
    job = make_job()
    del job["retry"]
    assert handler.handle(job, "default", raised(Boom("x")), options) == "dropped"
    assert r.zcard("dead") == 0


def test_retry_queue_rewrites_queue(r: redis.Redis, handler: RetryHandler) -> None:
    handler.handle(make_job(retry_queue="slow"), "default", raised(Boom("x")), None)
    entry, _ = only_entry(r, "retry")
    assert entry["queue"] == "slow"
    assert entry["retry_queue"] == "slow"


def _deep(n: int) -> None:
    if n == 0:
        raise Boom("deep")
    _deep(n - 1)


def deep_exception() -> BaseException:
    try:
        _deep(4)
    except Boom as exc:
        return exc
    raise AssertionError("unreachable")


def test_backtrace_true_stores_every_line(r: redis.Redis, handler: RetryHandler) -> None:
    handler.handle(make_job(backtrace=True), "default", deep_exception(), None)
    entry, _ = only_entry(r, "retry")
    lines = decode_backtrace(entry["error_backtrace"])
    assert entry["error_backtrace"].startswith("eJ")
    # deep_exception + _deep five times; innermost frame first, Ruby style.
    assert len(lines) == 6
    assert lines[0].endswith(":in `_deep'")
    assert lines[-1].endswith(":in `deep_exception'")
    assert all(line.count(":") >= 2 for line in lines)


def test_backtrace_n_stores_the_first_n_lines(r: redis.Redis, handler: RetryHandler) -> None:
    handler.handle(make_job(backtrace=2), "default", deep_exception(), None)
    entry, _ = only_entry(r, "retry")
    lines = decode_backtrace(entry["error_backtrace"])
    assert len(lines) == 2
    assert all(line.endswith(":in `_deep'") for line in lines)


def test_backtrace_from_options(r: redis.Redis, handler: RetryHandler) -> None:
    handler.handle(make_job(), "default", deep_exception(), make_options(backtrace=3))
    entry, _ = only_entry(r, "retry")
    assert len(decode_backtrace(entry["error_backtrace"])) == 3


def test_long_message_is_cut(r: redis.Redis, handler: RetryHandler) -> None:
    handler.handle(make_job(), "default", raised(Boom("x" * (MAX_MESSAGE + 500))), None)
    entry, _ = only_entry(r, "retry")
    assert len(entry["error_message"]) == MAX_MESSAGE


def test_ms_timestamps(r: redis.Redis, config: Config, handler: RetryHandler) -> None:
    config = tuned(config, timestamps="ms")
    handler = RetryHandler(config, rng=random.Random(42))
    handler.handle(make_job(), "default", raised(Boom("x")), None)
    entry, _ = only_entry(r, "retry")
    assert isinstance(entry["failed_at"], int)
    assert abs(entry["failed_at"] / 1000 - time.time()) < 5


def test_retry_for_exhausted(r: redis.Redis, handler: RetryHandler) -> None:
    job = make_job(retry_for=10, retry_count=0, failed_at=time.time() - 100)
    assert handler.handle(job, "default", raised(Boom("x")), None) == "dead"
    entry, _ = only_entry(r, "dead")
    assert entry["retry_count"] == 1
    assert r.zcard("retry") == 0


def test_retry_for_overrides_the_count(r: redis.Redis, handler: RetryHandler) -> None:
    # Well past 25 attempts, but still inside the retry_for window.
    job = make_job(retry_for=3600, retry_count=40, failed_at=time.time() - 100)
    assert handler.handle(job, "default", raised(Boom("x")), None) == "retry"
    assert r.zcard("dead") == 0


def test_retry_for_first_failure_retries(r: redis.Redis, handler: RetryHandler) -> None:
    assert handler.handle(make_job(retry_for=60), "default", raised(Boom("x")), None) == "retry"


def test_payload_retry_wins_over_options(r: redis.Redis, handler: RetryHandler) -> None:
    assert handler.handle(make_job(retry=0), "default", raised(Boom("x")),
                          make_options(retry=5)) == "dead"
    assert handler.handle(make_job(retry=5), "default", raised(Boom("x")),
                          make_options(retry=False)) == "retry"
    assert r.zcard("dead") == 1
    assert r.zcard("retry") == 1


def test_options_fill_in_a_missing_retry(r: redis.Redis, handler: RetryHandler) -> None:
    job = make_job()
    del job["retry"]
    assert handler.handle(job, "default", raised(Boom("x")), make_options(retry=0)) == "dead"
    job = make_job()
    del job["retry"]
    assert handler.handle(job, "default", raised(Boom("x")),
                          make_options(retry=False)) == "dropped"
    assert r.zcard("dead") == 1
    assert r.zcard("retry") == 0


def test_dead_max_jobs_trims_like_sidekiq(r: redis.Redis, config: Config,
                                          handler: RetryHandler) -> None:
    config = tuned(config, dead_max_jobs=3)
    handler = RetryHandler(config, rng=random.Random(42))
    jids = []
    for _ in range(5):
        job = make_job(retry=0)
        jids.append(job["jid"])
        assert handler.handle(job, "default", raised(Boom("x")), None) == "dead"
    # ZREMRANGEBYRANK dead 0 -3 keeps max - 1 members: the newest ones.
    survivors = [e["jid"] for e, _ in entries(r, "dead")]
    assert survivors == jids[-2:]


def test_dead_timeout_trims_old_entries(r: redis.Redis, config: Config,
                                        handler: RetryHandler) -> None:
    config = tuned(config, dead_timeout=100)
    handler = RetryHandler(config, rng=random.Random(42))
    now = time.time()
    r.zadd("dead", {"ancient": now - 1000, "recent": now - 50})
    handler.handle(make_job(retry=0), "default", raised(Boom("x")), None)
    members = r.zrange("dead", 0, -1)
    assert "ancient" not in members
    assert "recent" in members
    assert len(members) == 2


def test_kill_keeps_a_raw_string(r: redis.Redis, config: Config) -> None:
    kill(runtime_for(config), b"not json at all")
    assert r.zrange("dead", 0, -1) == ["not json at all"]


def test_death_handler_errors_are_contained(r: redis.Redis, config: Config,
                                            handler: RetryHandler) -> None:
    seen: list[str] = []

    def broken(job: Mapping[str, Any], exc: BaseException) -> None:
        raise RuntimeError("handler bug")

    config.death_handlers.extend([broken, lambda job, exc: seen.append(job["jid"])])
    job = make_job(retry=0)
    assert handler.handle(job, "default", raised(Boom("x")), None) == "dead"
    assert seen == [job["jid"]]
    assert r.zcard("dead") == 1


def test_retry_in_number_sets_the_delay(r: redis.Redis, handler: RetryHandler) -> None:
    calls: list[tuple[int, str]] = []

    def retry_in(count: int, exc: BaseException, job: Mapping[str, Any]) -> float:
        calls.append((count, type(exc).__name__))
        return 1000

    before = time.time()
    assert handler.handle(make_job(), "default", raised(Boom("x")),
                          make_options(retry_in=retry_in)) == "retry"
    _, at = only_entry(r, "retry")
    assert before + 1000 <= at < time.time() + 1010
    assert calls == [(0, "Boom")]


def test_retry_in_kill_sends_to_dead(r: redis.Redis, handler: RetryHandler) -> None:
    exhausted: list[str] = []
    options = make_options(retry_in=lambda c, e, j: "kill",
                           retries_exhausted=lambda job, exc: exhausted.append(job["jid"]))
    job = make_job()
    assert handler.handle(job, "default", raised(Boom("x")), options) == "dead"
    assert r.zcard("retry") == 0
    assert r.zcard("dead") == 1
    assert exhausted == [job["jid"]]


def test_retry_in_discard_drops(r: redis.Redis, handler: RetryHandler) -> None:
    options = make_options(retry_in=lambda c, e, j: "discard")
    assert handler.handle(make_job(), "default", raised(Boom("x")), options) == "dropped"
    assert r.zcard("retry") == 0
    assert r.zcard("dead") == 0


def test_broken_retry_in_falls_back_to_the_formula(r: redis.Redis,
                                                   handler: RetryHandler) -> None:
    def broken(count: int, exc: BaseException, job: Mapping[str, Any]) -> float:
        raise ZeroDivisionError

    before = time.time()
    assert handler.handle(make_job(), "default", raised(Boom("x")),
                          make_options(retry_in=broken)) == "retry"
    _, at = only_entry(r, "retry")
    assert before + 15 <= at <= time.time() + 24


def test_retries_exhausted_hook_errors_are_contained(r: redis.Redis,
                                                     handler: RetryHandler) -> None:
    def broken(job: Mapping[str, Any], exc: BaseException) -> None:
        raise RuntimeError("hook bug")

    options = make_options(retry=0, retries_exhausted=broken)
    job = make_job()
    del job["retry"]
    assert handler.handle(job, "default", raised(Boom("x")), options) == "dead"
    assert r.zcard("dead") == 1

"""The payload fields Sidekiq's retry reads with a fallback: null, missing and
wrong types, each as Sidekiq 6.4.1 treats it (lib/sidekiq/job_retry.rb, the
file Debian's ruby-sidekiq installs; line numbers below are that file's).

Where Sidekiq would break the job or lose it, wurk keeps it where a person
can see it and the test says so.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis
from test_retry import Boom, make_job, raised

from wurk.push.options import make_options
from wurk.runtime.retry import RetryHandler
from wurk.settings.config import Config


@pytest.fixture
def handler(config: Config) -> RetryHandler:
    return RetryHandler(config, rng=random.Random(7))


def fail(handler: RetryHandler, job: dict[str, Any], options: Any = None,
         queue: str = "default") -> str:
    return handler.handle(job, queue, raised(Boom("x")), options)


@pytest.mark.parametrize("null_or_missing", ["null", "missing"])
def test_a_null_retry_takes_the_class_option(r: redis.Redis, handler: RetryHandler,
                                             null_or_missing: str) -> None:
    """job_retry.rb:125-127: ``if msg["retry"].nil?`` then the worker class's
    ``sidekiq_options["retry"]``; before this, wurk dropped a job with "retry": null."""
    def job() -> dict[str, Any]:
        made = make_job(retry=None)
        if null_or_missing == "missing":
            del made["retry"]
        return made

    assert fail(handler, job(), make_options(retry=3)) == "retry"
    [(entry, _)] = [(json.loads(m), s) for m, s in r.zrange("retry", 0, -1, withscores=True)]
    assert entry["retry_count"] == 0
    assert fail(handler, job(), make_options(retry=0)) == "dead"
    assert fail(handler, job(), make_options(retry=False)) == "dropped"


def test_a_null_retry_of_a_class_this_process_does_not_know_retries(
        r: redis.Redis, handler: RetryHandler) -> None:
    """job_retry.rb:92-93: Sidekiq's global handler (no worker instance) treats
    a nil retry as false and drops the job; wurk retries it instead, so a
    deploy that adds the class can still run it (and it dies after max_retries)."""
    assert fail(handler, make_job(retry=None)) == "retry"
    assert r.zcard("retry") == 1


@pytest.mark.parametrize(("retry", "outcome"), [
    (0, "dead"), ("yes", "retry"), ("", "retry"), ([], "retry"), (2.5, "retry"),
])
def test_a_truthy_retry_that_is_not_a_count_uses_the_default_maximum(
        handler: RetryHandler, retry: Any, outcome: str) -> None:
    """job_retry.rb:129 (``raise e unless msg["retry"]``: only nil and false stop
    a retry in Ruby, 0 and "" are true) and :210-216 (``retry_attempts_from``:
    an Integer is the maximum, anything else means the default)."""
    assert fail(handler, make_job(retry=retry)) == outcome


@pytest.mark.parametrize("retry_queue", [None, "", 5, ["low"]])
def test_a_retry_queue_that_is_not_a_queue_name_keeps_the_fetched_queue(
        r: redis.Redis, handler: RetryHandler, retry_queue: Any) -> None:
    """job_retry.rb:144: ``msg["queue"] = (msg["retry_queue"] || queue)``: nil
    falls back to the fetched queue. Ruby would also take "" or 5 as a queue
    name and write a job no queue holds; wurk falls back for those too."""
    assert fail(handler, make_job(retry_queue=retry_queue), queue="fetched") == "retry"
    [member] = r.zrange("retry", 0, -1)
    assert json.loads(member)["queue"] == "fetched"


def test_the_fetched_queue_wins_over_the_payloads_queue(r: redis.Redis,
                                                       handler: RetryHandler) -> None:
    """job_retry.rb:144 uses the queue the job was fetched from, not msg["queue"]."""
    assert fail(handler, make_job(queue=None), queue="fetched") == "retry"
    [member] = r.zrange("retry", 0, -1)
    assert json.loads(member)["queue"] == "fetched"


@pytest.mark.parametrize(("dead", "outcome"), [
    (None, "dead"), ("no", "dead"), (0, "dead"), (False, "dropped"),
])
def test_only_dead_false_keeps_an_exhausted_job_out_of_the_morgue(
        handler: RetryHandler, dead: Any, outcome: str) -> None:
    """job_retry.rb:195: ``send_to_morgue(msg) unless msg["dead"] == false``."""
    assert fail(handler, make_job(retry=0, dead=dead)) == outcome


@pytest.mark.parametrize("retry_for", [None, "a day", [1]])
def test_a_retry_for_that_is_not_a_number_is_ignored(handler: RetryHandler,
                                                     retry_for: Any) -> None:
    """retry_for is Sidekiq 7.1's; anything but a finite number leaves the
    count-based rule in charge, as a missing retry_for does."""
    assert fail(handler, make_job(retry=1, retry_for=retry_for, retry_count=0)) == "dead"
    assert fail(handler, make_job(retry=3, retry_for=retry_for)) == "retry"


@pytest.mark.parametrize("field", ["error_message", "error_class", "failed_at",
                                   "error_backtrace"])
@pytest.mark.parametrize("value", [None, 5, {"x": 1}])
def test_old_failure_fields_of_any_shape_are_overwritten(r: redis.Redis,
                                                         handler: RetryHandler,
                                                         field: str, value: Any) -> None:
    """job_retry.rb:152-160: error_message, error_class and (on a first
    failure) failed_at are written afresh; error_backtrace only when asked."""
    assert fail(handler, make_job(**{field: value}), make_options(backtrace=True)) == "retry"
    [member] = r.zrange("retry", 0, -1)
    entry = json.loads(member)
    assert (entry["error_class"], entry["error_message"]) == ("Boom", "x")
    assert isinstance(entry["failed_at"], float)
    assert isinstance(entry["error_backtrace"], str)

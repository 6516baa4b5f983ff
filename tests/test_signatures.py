"""Push-time argument checks: a push that cannot fit its job fails before Redis.

Every enqueue verb (``perform_async``, ``perform_in``, ``perform_at``,
``set(...)``, ``perform_bulk``) and ``Client.push_bulk`` of a job this process
defines check the arguments against the job's signature and raise
``wurk.ArgumentError`` naming the job, its signature and the count; nothing
reaches Redis. A job this process does not define (Ruby's, say) is pushed
unchecked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

import wurk
from wurk.push.job import JobFunction
from wurk.settings.config import Config


@pytest.fixture
def nothing_pushed(r: redis.Redis) -> Iterator[None]:
    yield
    assert r.keys("*") == [], "a refused push wrote to Redis"


def welcome(user_id: int, address: str) -> None:
    pass


def greet(name: str, greeting: str = "hi") -> None:
    pass


def log_all(first: str, *rest: str) -> None:
    pass


def keyword_only(x: int, *, mode: str) -> None:
    pass


Define = Callable[..., JobFunction[..., Any]]


@pytest.mark.usefixtures("config", "nothing_pushed")
@pytest.mark.parametrize(("fn", "args", "message"), [
    (welcome, (42,), "(user_id: 'int', address: 'str') takes 2 arguments, got 1"),
    (welcome, (42, "a@b", "extra"), "takes 2 arguments, got 3"),
    (greet, (), "takes 1 to 2 arguments, got 0"),
    (greet, ("ada", "hello", "!"), "takes 1 to 2 arguments, got 3"),
    (log_all, (), "takes at least 1 argument, got 0"),
    (keyword_only, (1,), "needs keyword argument 'mode'"),
])
def test_every_verb_refuses_arguments_that_cannot_fit(define: Define, fn: Callable[..., Any],
                                                      args: tuple[Any, ...],
                                                      message: str) -> None:
    job = define(fn)
    verbs = [lambda: job.perform_async(*args), lambda: job.perform_in(30, *args),
             lambda: job.perform_at(2_000_000_000, *args),
             lambda: job.set(queue="other").perform_async(*args),
             lambda: job.perform_bulk([args])]
    for push in verbs:
        with pytest.raises(wurk.ArgumentError) as caught:
            push()
        assert job.name in str(caught.value) and message in str(caught.value)


def test_arguments_that_fit_are_pushed(config: Config, r: redis.Redis, define: Define) -> None:
    job = define(greet)
    job.perform_async("ada")
    job.perform_async("ada", "hello")
    define(log_all).perform_async("a", "b", "c")
    assert r.llen("queue:default") == 3


class Charge(wurk.Job, name=f"tests.Charge.{uuid.uuid4().hex}", queue="critical"):
    def perform(self, order_id: str, cents: int) -> None:
        pass


@pytest.mark.usefixtures("config", "nothing_pushed")
def test_class_jobs_are_checked_without_self() -> None:
    with pytest.raises(wurk.ArgumentError, match=r"\(order_id: 'str', cents: 'int'\) takes 2 "
                                                 r"arguments, got 1"):
        Charge.perform_async("order-1")
    with pytest.raises(wurk.ArgumentError):
        Charge.set(retry=False).perform_in(5, "order-1", 100, "extra")


@pytest.mark.usefixtures("nothing_pushed")
def test_a_bulk_push_with_one_bad_job_pushes_none(config: Config, define: Define) -> None:
    job = define(welcome)
    with pytest.raises(wurk.ArgumentError, match=r"got 1 in args\[1\]"):
        job.perform_bulk([(1, "a@b"), (2,), (3, "c@d")])
    with pytest.raises(wurk.ArgumentError, match=r"got 3 in args\[0\]"):
        wurk.Client(config).push_bulk({"class": job.name, "args": [[1, "a", "b"]]})


def test_perform_bulk_pushes_every_job(config: Config, r: redis.Redis, define: Define) -> None:
    jids = define(welcome).perform_bulk([(i, f"u{i}@example.com") for i in range(2500)])
    assert len(set(jids)) == 2500 and r.llen("queue:default") == 2500


def test_jobs_this_process_does_not_define_are_pushed_unchecked(config: Config,
                                                                r: redis.Redis) -> None:
    client = wurk.Client(config)
    client.push({"class": "RubyOnlyJob", "args": [1, 2, 3]})
    client.push_bulk({"class": "RubyOnlyJob", "args": [[], [1]]})
    assert r.llen("queue:default") == 3


@pytest.mark.usefixtures("nothing_pushed")
def test_perform_at_refuses_a_naive_datetime(config: Config, define: Define) -> None:
    job = define(greet)
    with pytest.raises(wurk.ArgumentError, match="timezone-aware datetime"):
        job.perform_at(datetime(2030, 1, 1, 12, 0), "ada")
    with pytest.raises(wurk.ArgumentError, match="epoch seconds"):
        job.perform_at("tomorrow", "ada")  # type: ignore[arg-type]


def test_perform_at_takes_an_aware_datetime(config: Config, r: redis.Redis,
                                            define: Define) -> None:
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    define(greet).perform_at(when, "ada")
    [(_, score)] = r.zrange("schedule", 0, -1, withscores=True)
    assert score == when.timestamp()


def test_a_discarded_job_is_no_longer_checked(config: Config, r: redis.Redis) -> None:
    job = wurk.job(name=f"tests.gone.{uuid.uuid4().hex}")(welcome)
    wurk.registry.discard(job.name)
    job.perform_async()
    assert r.llen("queue:default") == 1

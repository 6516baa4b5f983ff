"""Client middleware: code that runs before every push (wurk.push.middleware),
against a real redis-server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs
from tuning import tuned

import wurk
from wurk.api import RetrySet
from wurk.push.client import BULK_BATCH, Client
from wurk.push.job import Registry
from wurk.redis.pool import RedisPool
from wurk.settings.config import Config
from wurk.wire.payload import ArgumentError

Call = tuple[str, dict[str, Any], str, Any]
Middleware = Callable[[str, dict[str, Any], str, Any, Callable[[], Any]], Any]


def queued(r: redis.Redis, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(r.lrange(f"queue:{queue}", 0, -1))]


def recording(name: str, seen: list[str], calls: list[Call] | None = None) -> Middleware:
    def mw(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
           call_next: Callable[[], Any]) -> None:
        seen.append(f"{name}>")
        if calls is not None:
            calls.append((job_class, dict(payload), queue, redis_))
        call_next()
        seen.append(f"<{name}")
    return mw


def test_every_middleware_wraps_the_push_first_one_outermost(
        config: Config, r: redis.Redis) -> None:
    seen: list[str] = []
    calls: list[Call] = []
    config = tuned(config, client_middleware=[*config.client_middleware,
                                              recording("a", seen, calls), recording("b", seen)])
    client = Client(config)
    jid = client.push({"class": "Mailer", "args": [1], "queue": "mail"})
    assert seen == ["a>", "b>", "<b", "<a"]
    [(job_class, payload, queue, pool)] = calls
    assert (job_class, queue, payload["jid"], payload["args"]) == ("Mailer", "mail", jid, [1])
    assert "enqueued_at" in payload and "created_at" in payload
    assert isinstance(pool, RedisPool) and pool is client.pool
    assert [job["jid"] for job in queued(r, "mail")] == [jid]


def test_a_middleware_changes_the_payload_in_place_and_may_use_redis(
        config: Config, r: redis.Redis) -> None:
    def stamp(job_class: str, payload: dict[str, Any], queue: str, pool: RedisPool,
              call_next: Callable[[], Any]) -> None:
        payload["trace"] = "00-abc-01"
        payload["queue"] = "elsewhere"
        pool.call("INCR", f"pushed:{job_class}")
        call_next()

    config.client_middleware.append(stamp)
    jid = Client(config).push({"class": "Mailer", "args": []})
    [job] = queued(r, "elsewhere")
    assert (job["jid"], job["trace"], job["queue"]) == (jid, "00-abc-01", "elsewhere")
    assert r.llen("queue:default") == 0 and "elsewhere" in r.smembers("queues")
    assert r.get("pushed:Mailer") == "1"


def test_not_calling_call_next_stops_the_push(config: Config, r: redis.Redis) -> None:
    seen: list[str] = []

    def stop(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
             call_next: Callable[[], Any]) -> None:
        seen.append("stop")

    config = tuned(config, client_middleware=[*config.client_middleware, stop,
                                              recording("inner", seen)])
    assert Client(config).push({"class": "Mailer", "args": []}) is None
    assert Client(config).push({"class": "Mailer", "args": [], "at": time.time() + 60}) is None
    assert seen == ["stop", "stop"]  # the inner one never ran
    assert r.llen("queue:default") == 0 and r.zcard("schedule") == 0 and not r.exists("queues")


def test_perform_async_returns_none_when_stopped(config: Config, r: redis.Redis) -> None:
    @wurk.job(name="Guarded", registry_=Registry())
    def guarded(n: int) -> None:
        """Never runs here."""

    def only_even(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
                  call_next: Callable[[], Any]) -> None:
        if payload["args"][0] % 2 == 0:
            call_next()

    config.client_middleware.append(only_even)
    assert guarded.perform_async(1) is None
    jid = guarded.perform_async(2)
    assert jid is not None and [job["jid"] for job in queued(r)] == [jid]


def test_a_scheduled_push_shows_at_and_a_middleware_may_move_it(
        config: Config, r: redis.Redis) -> None:
    at = time.time() + 3600
    seen_at: list[float] = []

    def run_now(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
                call_next: Callable[[], Any]) -> None:
        seen_at.append(payload["at"])
        if payload["args"] == ["now"]:
            del payload["at"]
        else:
            payload["at"] = payload["at"] + 60
        call_next()

    config.client_middleware.append(run_now)
    client = Client(config)
    now_jid = client.push({"class": "Mailer", "args": ["now"], "at": at})
    later_jid = client.push({"class": "Mailer", "args": ["later"], "at": at})
    assert seen_at == [at, at]
    [job] = queued(r)
    assert job["jid"] == now_jid and "enqueued_at" in job and "at" not in job
    [(raw, score)] = r.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(raw)["jid"] == later_jid and "at" not in json.loads(raw)
    assert score == pytest.approx(at + 60)


def test_a_raising_or_payload_breaking_middleware_writes_nothing(
        config: Config, r: redis.Redis) -> None:
    def boom(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
             call_next: Callable[[], Any]) -> None:
        raise RuntimeError("no pushes today")

    def unjsonable(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
                   call_next: Callable[[], Any]) -> None:
        payload["args"] = [object()]
        call_next()

    config.client_middleware.append(boom)
    with pytest.raises(RuntimeError, match="no pushes today"):
        Client(config).push({"class": "Mailer", "args": []})
    config.client_middleware[:] = [unjsonable]
    with pytest.raises(ArgumentError):
        Client(config).push({"class": "Mailer", "args": []})
    assert r.llen("queue:default") == 0 and not r.exists("queues")


def test_push_bulk_runs_the_chain_per_job_and_returns_the_pushed_jids(
        config: Config, r: redis.Redis) -> None:
    def odd_only(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
                 call_next: Callable[[], Any]) -> None:
        if payload["args"][0] % 2:
            payload["n"] = payload["args"][0]
            call_next()

    config.client_middleware.append(odd_only)
    count = BULK_BATCH + 11
    # A class no test defines: test_job's "Mailer" takes a str, and a job this
    # process defines is checked against its annotations.
    jids = Client(config).push_bulk({"class": "Numbered", "args": [[i] for i in range(count)]})
    jobs = queued(r)
    assert len(jids) == len(jobs) == count // 2
    assert [job["jid"] for job in jobs] == jids
    assert [job["n"] for job in jobs] == list(range(1, count, 2))
    # A whole batch stopped: nothing written, nothing returned.
    assert Client(config).push_bulk({"class": "Numbered", "args": [[0], [2]]}) == []


def test_the_api_retry_goes_through_the_chain_and_says_when_it_was_stopped(
        config: Config, r: redis.Redis) -> None:
    raw = json.dumps({"class": "Mailer", "args": [], "jid": "c" * 24, "queue": "default",
                      "retry": True, "retry_count": 1, "error_class": "E",
                      "error_message": "m", "failed_at": time.time(),
                      "created_at": time.time()})
    r.zadd("retry", {raw: time.time() + 30})
    seen: list[str] = []

    def refuse(job_class: str, payload: dict[str, Any], queue: str, redis_: Any,
               call_next: Callable[[], Any]) -> None:
        seen.append(payload["jid"])

    config.client_middleware.append(refuse)
    entry = RetrySet(config=config).find_job("c" * 24, must_exist=True)
    assert entry is not None
    with capture_logs() as logs:
        assert entry.retry()
    assert seen == ["c" * 24]
    assert r.zcard("retry") == 0 and r.llen("queue:default") == 0
    [stopped] = [e for e in logs if e["event"] == "api.push_stopped"]
    assert stopped["jid"] == "c" * 24 and json.loads(stopped["payload"])["jid"] == "c" * 24


def test_without_middleware_the_push_is_as_before(config: Config, r: redis.Redis) -> None:
    assert config.client_middleware == []
    jid = Client(config).push({"class": "Mailer", "args": [1]})
    [job] = queued(r)
    assert job["jid"] == jid and set(job) == {"class", "args", "jid", "queue", "retry",
                                              "created_at", "enqueued_at"}

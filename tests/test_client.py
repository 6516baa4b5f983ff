"""The client: payloads exactly as Sidekiq writes them, against a real Redis."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Any

import pytest
import redis

import wurk
from wurk.push.client import BULK_BATCH, Client
from wurk.push.job import Registry
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config
from wurk.wire import keys

JID = re.compile(r"^[0-9a-f]{24}$")
FLOAT_STAMP = r"\d+\.\d+"


def raw_queue(r: redis.Redis, queue: str = "default") -> list[str]:
    """Every raw JSON string in ``queue:<queue>``, oldest first."""
    return list(reversed(r.lrange(keys.queue(queue), 0, -1)))


def only_job(r: redis.Redis, queue: str = "default") -> tuple[str, dict[str, Any]]:
    raws = raw_queue(r, queue)
    assert len(raws) == 1, raws
    return raws[0], json.loads(raws[0])


def schedule(r: redis.Redis) -> list[tuple[str, float]]:
    return r.zrange(keys.SCHEDULE, 0, -1, withscores=True)


@pytest.fixture
def client(config: Config) -> Client:
    return Client(config)


@pytest.fixture
def echo(config: Config) -> wurk.JobFunction[..., Any]:
    """A function job in a private registry, pushed through the default client."""

    @wurk.job(name="Echo", registry_=Registry())
    def echo_job(*args: Any) -> tuple[Any, ...]:
        return args

    return echo_job


# -- push: the payload ----------------------------------------------------

def test_push_writes_sidekiq_payload(client: Client, r: redis.Redis) -> None:
    before = time.time()
    jid = client.push({"class": "WurkEcho", "args": [1, "two", {"three": 3}]})
    after = time.time()

    raw, job = only_job(r)
    assert JID.match(jid)
    assert job["jid"] == jid
    assert job["class"] == "WurkEcho"
    assert job["args"] == [1, "two", {"three": 3}]
    assert job["queue"] == "default"
    assert job["retry"] is True
    assert before <= job["created_at"] <= job["enqueued_at"] <= after
    assert list(job) == ["retry", "queue", "class", "args", "jid", "created_at", "enqueued_at"]
    # Written as JSON floats with a fraction, compact, as Ruby's JSON does.
    assert re.search(rf'"created_at":{FLOAT_STAMP}[,}}]', raw)
    assert re.search(rf'"enqueued_at":{FLOAT_STAMP}[,}}]', raw)
    assert re.search(r'"jid":"[0-9a-f]{24}"', raw)
    assert " " not in raw.replace('"two"', "")
    assert r.smembers(keys.QUEUES) == {"default"}
    assert r.zcard(keys.SCHEDULE) == 0


def test_push_to_named_queue_registers_it(client: Client, r: redis.Redis) -> None:
    client.push({"class": "A", "args": [], "queue": "mail"})
    client.push({"class": "B", "args": [], "queue": "critical"})
    assert r.smembers(keys.QUEUES) == {"mail", "critical"}
    assert r.type("queue:mail") == "list"
    assert only_job(r, "mail")[1]["queue"] == "mail"
    assert only_job(r, "critical")[1]["class"] == "B"
    assert r.llen("queue:default") == 0


def test_push_is_lpush_so_oldest_is_at_the_right(client: Client, r: redis.Redis) -> None:
    first = client.push({"class": "A", "args": [1]})
    second = client.push({"class": "A", "args": [2]})
    assert json.loads(r.lindex("queue:default", -1))["jid"] == first
    assert json.loads(r.lindex("queue:default", 0))["jid"] == second
    assert first != second


def test_jids_are_unique_lowercase_hex(client: Client) -> None:
    jids = {client.push({"class": "A", "args": []}) for _ in range(200)}
    assert len(jids) == 200
    assert all(JID.match(j) for j in jids)


def test_ms_timestamps_are_integer_milliseconds(redis_server: Any, r: redis.Redis) -> None:
    cfg = Config(redis_url=redis_server.url, timestamps="ms")
    try:
        before = int(time.time() * 1000)
        Client(cfg).push({"class": "A", "args": []})
        after = int(time.time() * 1000) + 1
    finally:
        close_runtime(cfg)
    raw, job = only_job(r)
    assert re.search(r'"created_at":\d{13}[,}]', raw)
    assert re.search(r'"enqueued_at":\d{13}[,}]', raw)
    assert isinstance(job["created_at"], int)
    assert isinstance(job["enqueued_at"], int)
    assert before <= job["created_at"] <= job["enqueued_at"] <= after


def test_unknown_keys_survive_byte_for_byte(client: Client, r: redis.Redis) -> None:
    extras = {
        "bid": "b-3dd9c0a2f1",
        "tags": ["alpha", "über", "日本"],
        "unique_for": 3600,
        "wrapped": "SomeActiveJob",
        "cattr": {"tenant": 7, "nested": [1.5, None, True]},
    }
    client.push({"class": "A", "args": [1], **extras})
    raw, job = only_job(r)
    for name, value in extras.items():
        fragment = f'"{name}":' + json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        assert fragment in raw
        assert job[name] == value


def test_given_jid_and_created_at_are_kept(client: Client, r: redis.Redis) -> None:
    jid = "0123456789abcdef01234567"
    jid_back = client.push({"class": "A", "args": [], "jid": jid, "created_at": 1700000000.25,
                            "enqueued_at": 1.5})
    job = only_job(r)[1]
    assert jid_back == jid
    assert job["jid"] == jid
    assert job["created_at"] == 1700000000.25
    # enqueued_at is written on every push.
    assert job["enqueued_at"] > 1700000000.25


def test_push_payload_retry_and_queue_override_defaults(client: Client, r: redis.Redis) -> None:
    client.push({"class": "A", "args": [], "retry": 5, "queue": "low"})
    job = only_job(r, "low")[1]
    assert job["retry"] == 5
    assert list(job)[:2] == ["retry", "queue"]
    client.push({"class": "A", "args": [], "retry": False})
    assert only_job(r)[1]["retry"] is False


def test_push_with_absolute_at_is_scheduled(client: Client, r: redis.Redis) -> None:
    when = time.time() + 3600
    jid = client.push({"class": "A", "args": [1], "at": when, "enqueued_at": 123.5})
    ((member, run_at),) = schedule(r)
    job = json.loads(member)
    assert run_at == pytest.approx(when, abs=1e-6)
    assert job["jid"] == jid
    assert "at" not in job
    assert "enqueued_at" not in job
    assert re.search(rf'"created_at":{FLOAT_STAMP}[,}}]', member)
    assert r.exists(keys.QUEUES, "queue:default") == 0


# -- push_bulk ---------------------------------------------------------------

def test_push_bulk_one_jid_per_job_same_created_at(client: Client, r: redis.Redis) -> None:
    args = [[i, f"n{i}"] for i in range(5)]
    jids = client.push_bulk({"class": "Bulk", "args": args, "queue": "bulk", "tags": ["x"]})
    assert len(jids) == 5
    assert len(set(jids)) == 5
    assert all(JID.match(j) for j in jids)
    jobs = [json.loads(raw) for raw in raw_queue(r, "bulk")]
    assert [j["jid"] for j in jobs] == jids
    assert [j["args"] for j in jobs] == args
    assert len({j["created_at"] for j in jobs}) == 1
    assert all(j["class"] == "Bulk" and j["queue"] == "bulk" for j in jobs)
    assert all(j["tags"] == ["x"] and j["retry"] is True for j in jobs)
    assert all(isinstance(j["enqueued_at"], float) for j in jobs)
    assert r.smembers(keys.QUEUES) == {"bulk"}


def test_push_bulk_scalar_at_goes_to_schedule(client: Client, r: redis.Redis) -> None:
    when = time.time() + 600
    jids = client.push_bulk({"class": "Bulk", "args": [[1], [2], [3]], "at": when})
    members = schedule(r)
    assert len(members) == 3
    assert {json.loads(m)["jid"] for m, _ in members} == set(jids)
    for member, run_at in members:
        job = json.loads(member)
        assert run_at == pytest.approx(when, abs=1e-6)
        assert "at" not in job
        assert "enqueued_at" not in job
    assert r.exists("queue:default", keys.QUEUES) == 0


def test_push_bulk_list_at_gives_each_job_its_time(client: Client, r: redis.Redis) -> None:
    base = time.time()
    ats = [base + 100, base + 300, base + 200]
    jids = client.push_bulk({"class": "Bulk", "args": [["a"], ["b"], ["c"]], "at": ats})
    by_jid = {json.loads(m)["jid"]: (json.loads(m), score) for m, score in schedule(r)}
    for jid, at, arg in zip(jids, ats, ["a", "b", "c"], strict=True):
        job, run_at = by_jid[jid]
        assert run_at == pytest.approx(at, abs=1e-6)
        assert job["args"] == [arg]
        assert "at" not in job
        assert "enqueued_at" not in job


def test_push_bulk_at_list_with_wrong_length_is_refused(client: Client, r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="one time per job"):
        client.push_bulk({"class": "Bulk", "args": [[1], [2]], "at": [time.time() + 5]})
    assert r.dbsize() == 0


def test_push_bulk_needs_list_of_lists(client: Client, r: redis.Redis) -> None:
    with pytest.raises(TypeError):
        client.push_bulk({"class": "Bulk", "args": [1, 2]})
    with pytest.raises(TypeError):
        client.push_bulk({"class": "Bulk", "args": "nope"})
    assert r.dbsize() == 0


def test_push_bulk_empty_pushes_nothing(client: Client, r: redis.Redis) -> None:
    assert client.push_bulk({"class": "Bulk", "args": []}) == []
    assert r.dbsize() == 0


def test_push_bulk_over_a_thousand_jobs_is_batched(client: Client, r: redis.Redis) -> None:
    count = 2 * BULK_BATCH + 500
    r.config_resetstat()
    jids = client.push_bulk({"class": "Bulk", "args": [[i] for i in range(count)]})
    assert len(jids) == count
    assert len(set(jids)) == count
    jobs = [json.loads(raw) for raw in raw_queue(r)]
    assert [j["args"][0] for j in jobs] == list(range(count))
    assert [j["jid"] for j in jobs] == jids
    assert len({j["created_at"] for j in jobs}) == 1
    # One LPUSH per batch of a thousand.
    assert r.info("commandstats")["cmdstat_lpush"]["calls"] == 3


# -- the job verbs -------------------------------------------------------------

def test_perform_async_payload(echo: Any, r: redis.Redis) -> None:
    jid = echo.perform_async(1, "two", [3.5], {"k": None})
    raw, job = only_job(r)
    assert job["jid"] == jid
    assert job["class"] == "Echo"
    assert job["args"] == [1, "two", [3.5], {"k": None}]
    assert list(job) == ["retry", "queue", "class", "args", "jid", "created_at", "enqueued_at"]
    assert re.search(rf'"enqueued_at":{FLOAT_STAMP}[,}}]', raw)
    assert r.smembers(keys.QUEUES) == {"default"}


def test_perform_in_lands_in_schedule(echo: Any, r: redis.Redis) -> None:
    before = time.time()
    jid = echo.perform_in(60, "later")
    after = time.time()
    ((member, run_at),) = schedule(r)
    job = json.loads(member)
    assert before + 60 <= run_at <= after + 60
    assert job["jid"] == jid
    assert job["args"] == ["later"]
    assert "enqueued_at" not in job
    assert "at" not in job
    assert re.search(rf'"created_at":{FLOAT_STAMP}[,}}]', member)
    assert r.exists("queue:default", keys.QUEUES) == 0


def test_perform_in_with_an_epoch_is_absolute(echo: Any, r: redis.Redis) -> None:
    # Sidekiq's rule: an interval of 1e9 or more is an absolute time.
    when = time.time() + 7200
    echo.perform_in(when, 1)
    ((_member, run_at),) = schedule(r)
    assert run_at == pytest.approx(when, abs=1e-3)


@pytest.mark.parametrize("delay", [0, -5, -0.5])
def test_perform_in_not_in_the_future_pushes_now(echo: Any, r: redis.Redis,
                                                  delay: float) -> None:
    jid = echo.perform_in(delay, "now")
    raw, job = only_job(r)
    assert job["jid"] == jid
    assert "at" not in job
    assert re.search(rf'"enqueued_at":{FLOAT_STAMP}[,}}]', raw)
    assert r.zcard(keys.SCHEDULE) == 0


def test_perform_at_absolute_epoch(echo: Any, r: redis.Redis) -> None:
    when = round(time.time()) + 86_400.25
    jid = echo.perform_at(when, "x")
    ((member, run_at),) = schedule(r)
    assert run_at == when
    assert json.loads(member)["jid"] == jid
    assert "enqueued_at" not in json.loads(member)


def test_perform_at_aware_datetime(echo: Any, r: redis.Redis) -> None:
    when = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=2)
    echo.perform_at(when, "x")
    ((_member, run_at),) = schedule(r)
    assert run_at == when.timestamp()


def test_perform_at_in_the_past_pushes_now(echo: Any, r: redis.Redis) -> None:
    echo.perform_at(time.time() - 60, "late")
    assert only_job(r)[1]["args"] == ["late"]
    assert r.zcard(keys.SCHEDULE) == 0


def test_set_overrides_queue_and_retry(echo: Any, r: redis.Redis) -> None:
    echo.set(queue="other", retry=3).perform_async(1)
    job = only_job(r, "other")[1]
    assert job["queue"] == "other"
    assert job["retry"] == 3
    assert r.smembers(keys.QUEUES) == {"other"}
    # The override is one-off: the job's own options are unchanged.
    echo.perform_async(2)
    job = only_job(r)[1]
    assert job["queue"] == "default"
    assert job["retry"] is True


def test_set_then_perform_in(echo: Any, r: redis.Redis) -> None:
    echo.set(queue="other", retry=False, backtrace=5).perform_in(30, 1)
    ((member, _run_at),) = schedule(r)
    job = json.loads(member)
    assert (job["queue"], job["retry"], job["backtrace"]) == ("other", False, 5)


# -- refusing bad input before anything reaches Redis ----------------------------

class Opaque:
    pass


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ([1, dt.datetime(2024, 1, 1)], "args[1]"),
        ([{1, 2}], "args[0]"),
        (["ok", (1, 2)], "args[1]"),
        ([1.0, float("nan")], "args[1]"),
        ([float("inf")], "args[0]"),
        ([{1: "a"}], "args[0]"),
        ([0, [1, Opaque()]], "args[1][1]"),
        ([{"outer": [Opaque()]}], "args[0]['outer'][0]"),
        ([b"bytes"], "args[0]"),
    ],
)
def test_non_json_args_are_refused(client: Client, echo: Any, r: redis.Redis,
                                   args: list[Any], path: str) -> None:
    with pytest.raises(wurk.ArgumentError) as push_err:
        client.push({"class": "A", "args": args})
    assert path in str(push_err.value)
    with pytest.raises(wurk.ArgumentError) as verb_err:
        echo.perform_async(*args)
    assert path in str(verb_err.value)
    with pytest.raises(wurk.ArgumentError):
        echo.perform_in(60, *args)
    with pytest.raises(wurk.ArgumentError):
        client.push_bulk({"class": "A", "args": [[1], args]})
    assert r.dbsize() == 0


@pytest.mark.parametrize(
    "item",
    [
        {"class": None, "args": []},
        {"class": 123, "args": []},
        {"class": "", "args": []},
        {"class": Client, "args": []},
        {"args": []},
        {"class": "A", "args": [], "queue": 5},
        {"class": "A", "args": [], "queue": ""},
        {"class": "A", "args": [], "queue": None},
        {"class": "A", "args": "notalist"},
        {"class": "A", "args": (1, 2)},
        # A bad "at" is a wurk.ArgumentError (a TypeError): test_hostile_times.py.
    ],
)
def test_bad_class_queue_args_types(client: Client, r: redis.Redis,
                                    item: dict[str, Any]) -> None:
    with pytest.raises(TypeError) as err:
        client.push(item)
    assert err.type is TypeError
    assert r.dbsize() == 0


def test_the_default_client_follows_wurk_configure(config: Config, r: redis.Redis,
                                                    own_redis: Any) -> None:
    """A second ``wurk.configure`` (a framework loading its settings, a test)
    sends later pushes to the new Redis, not through the first config's client."""
    job = wurk.job(name="follows_configure")(lambda: None)
    job.perform_async()
    assert r.llen(keys.queue("default")) == 1
    other = Config(redis_url=own_redis.url, log_level="warning")
    wurk.configure(other)
    try:
        job.perform_async()
        with own_redis.client() as elsewhere:
            assert elsewhere.llen(keys.queue("default")) == 1
        assert r.llen(keys.queue("default")) == 1
    finally:
        wurk.configure(config)
        close_runtime(other)

"""A plain push_bulk serialised once: the same bytes, the same checks, fresh jids."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
import redis
from faultproxy import FaultProxy
from structlog.testing import capture_logs

import wurk
from wurk.push import bulk_template, prepare
from wurk.push.bulk_template import Template
from wurk.push.client import Client
from wurk.push.job import Registry
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import ArgumentError, compact_json, dumps, with_ruby_floats

JID = re.compile(r"^[0-9a-f]{24}$")
NOW = 1_796_022_178.306
ARGS: list[list[Any]] = [
    [], [1], ["é ☃ \u2028 \"quoted\" \\"], [1.0, 1e16, 1e15, 123456789012345.0, -2.5e-7, 0.1],
    [{"nested": [{"deep": [None, True, False]}], "f": 1e22}], [2**70, -0.0, ""],
]


def whole(item: dict[str, Any], args: list[Any], jid: str, timestamps: str = "float") -> str:
    """The text a job by job push writes for one job of ``item``, with ``jid``."""
    shared = prepare.bulk_shared(item)
    one = prepare.bulk_item(shared, args, item.get("at"), prepare.now_stamp(timestamps, NOW))
    payload, _ = prepare.normalise(one, NOW, timestamps)
    payload["jid"] = jid
    return dumps(payload)


@pytest.mark.parametrize("item", [
    {"class": "Plain"},
    {"class": "Ünïcode ☃", "queue": "crit", "retry": False, "tags": ["a", 1.0, 1e16]},
    {"queue": "q", "class": "Order", "created_at": 1.5e15, "x": {"y": [1e-9]}},
    {"class": "Expires", "expires_in": 30, "backtrace": 5},
    {"class": "Later", "at": NOW + 60.25, "expires_in": 10.5},
    {"class": "Past", "at": NOW - 1},
    {"class": "Given", "enqueued_at": 1.0, "retry": 3, "dead": False},
])
@pytest.mark.parametrize("timestamps", ["float", "ms"])
def test_template_writes_the_bytes_of_each_whole_payload(item: dict[str, Any],
                                                         timestamps: str) -> None:
    sample = prepare.bulk_item(prepare.bulk_shared(item), [], item.get("at"),
                               prepare.now_stamp(timestamps, NOW))
    template = Template.of(prepare.normalise(sample, NOW, timestamps))
    assert template is not None
    jobs = template.jobs(ARGS)
    assert [job.raw for job in jobs] == [whole(item, args, job.jid, timestamps)
                                         for args, job in zip(ARGS, jobs, strict=True)]
    assert all(json.loads(job.raw)["args"] == args for args, job in zip(ARGS, jobs, strict=True))
    assert {job.run_at for job in jobs} == {prepare.run_time(item.get("at"), NOW)}


@pytest.mark.parametrize("value", [
    {"a": 1.0, "b": [1e16, 1e15, -0.0, 5e-324, 1.7976931348623157e308]},
    "é ☃ \x00 \u2028 \ud83d\ude00", 1.5, 10**30, [], {}, [[[[{"k": None}]]]], True, None,
])
def test_shared_encoder_writes_what_json_dumps_writes(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert compact_json(value) == expected
    assert dumps(value) == with_ruby_floats(expected)


@pytest.mark.parametrize(("value", "error"), [
    (float("nan"), ValueError), ([float("inf")], ValueError), ({1j: 1}, TypeError),
    (object(), TypeError), ({"a": {1, 2}}, TypeError),
])
def test_shared_encoder_refuses_what_json_dumps_refuses(value: Any,
                                                        error: type[Exception]) -> None:
    with pytest.raises(error) as ours:
        compact_json(value)
    with pytest.raises(error) as stock:
        json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert str(ours.value) == str(stock.value)


def test_shared_encoder_still_names_a_circular_structure() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        compact_json(loop)
    assert compact_json([1]) == "[1]"  # and is not left in a bad state


@pytest.mark.parametrize(("item", "applies"), [
    ({"class": "A", "args": [[1]]}, True),
    ({"class": "A", "args": [[1]], "at": NOW}, True),
    ({"class": "A", "args": [[1]], "at": [NOW]}, False),
    ({"class": "A", "args": [[1]], "unique_for": 60}, False),
    ({"class": "A", "args": [[1]], "bid": "b1"}, False),
    ({"class": "A", "args": [[1]], 7: "odd key"}, False),
])
def test_only_plain_items_take_the_template(item: dict[Any, Any], applies: bool) -> None:
    assert bulk_template.applies(item, []) is applies
    assert bulk_template.applies(item, [lambda *a: a[-1]()]) is False


# -- through the client, against Redis -------------------------------------------------

def passthrough(_cls: str, _payload: dict[str, Any], _queue: str, _redis: Any,
                call_next: Any) -> None:
    call_next()


@pytest.mark.parametrize("item", [
    {"class": "Bulk", "queue": "q", "tags": ["é"], "expires_in": 5.5},
    {"class": "Bulk", "at": NOW + 3600},
])
def test_plain_bulk_writes_what_the_job_by_job_path_writes(
        config: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        item: dict[str, Any]) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)
    args = [[i, i / 3, "x" * i] for i in range(1500)]
    written = []
    for client in (Client(config), Client(config, middleware=[passthrough])):
        jids = client.push_bulk({**item, "args": args})
        raws = (list(reversed(r.lrange(keys.queue(item.get("queue", "default")), 0, -1)))
                or r.zrange(keys.SCHEDULE, 0, -1))
        assert len(raws) == len(args)
        by_jid = {json.loads(raw)["jid"]: raw for raw in raws}
        written.append([by_jid[jid].replace(jid, "<jid>") for jid in jids])
        r.flushdb()
    assert written[0] == written[1]


def test_async_client_writes_what_the_sync_client_writes(
        config: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)
    item = {"class": "Bulk", "queue": "q", "args": [[i, i / 7] for i in range(1200)]}

    async def push(middleware: list[Any]) -> list[str]:
        async with wurk.AsyncClient(config, middleware=middleware, drain_spool=False) as client:
            return await client.push_bulk(item)

    written = []
    for pusher in (lambda: Client(config).push_bulk(item), lambda: asyncio.run(push([])),
                   lambda: asyncio.run(push([passthrough]))):
        jids = pusher()
        by_jid = {json.loads(raw)["jid"]: raw for raw in r.lrange(keys.queue("q"), 0, -1)}
        written.append([by_jid[jid].replace(jid, "<jid>") for jid in jids])
        r.flushdb()
    assert written[0] == written[1] == written[2]
    assert len(written[0]) == 1200


def test_bulk_jids_are_fresh_24_hex_in_order(config: Config, r: redis.Redis) -> None:
    jids = Client(config).push_bulk({"class": "Bulk", "args": [[i] for i in range(2500)]})
    assert len(set(jids)) == 2500
    assert all(JID.match(jid) for jid in jids)
    queued = [json.loads(raw) for raw in reversed(r.lrange(keys.queue("default"), 0, -1))]
    assert [job["jid"] for job in queued] == jids
    assert [job["args"] for job in queued] == [[i] for i in range(2500)]


def test_a_bad_arg_in_the_last_job_pushes_nothing(config: Config, r: redis.Redis) -> None:
    args: list[list[Any]] = [[i] for i in range(2500)]
    args[-1] = [1, float("nan")]
    with pytest.raises(ArgumentError, match=r"args\[2499\]\[1\]"):
        Client(config).push_bulk({"class": "Bulk", "args": args})
    assert r.dbsize() == 0


def test_an_int_too_long_to_write_in_the_last_job_pushes_nothing(
        config: Config, r: redis.Redis) -> None:
    huge = 10 ** 5000  # over Python's 4,300-digit limit for writing an int
    args: list[list[Any]] = [[i] for i in range(1500)] + [[huge]]
    with pytest.raises(ArgumentError, match=r"args\[1500\]\[0\] is an integer of more than"):
        Client(config).push_bulk({"class": "Bulk", "args": args})
    nested: list[list[Any]] = [[i] for i in range(1500)] + [[{"n": [huge]}]]
    with pytest.raises(ArgumentError, match=r"args\[1500\]\[0\]\['n'\]\[0\]"):
        Client(config).push_bulk({"class": "Bulk", "args": nested})
    with pytest.raises(ArgumentError, match="integer of more than"):
        Client(config).push({"class": "Bulk", "args": [1, huge]})
    assert r.dbsize() == 0
    # A long int Python does write is carried whole.
    long = 10 ** 1000
    Client(config).push_bulk({"class": "Bulk", "args": [[long], [-long]]})
    queued = [json.loads(raw)["args"] for raw in r.lrange(keys.queue("default"), 0, -1)]
    assert sorted(queued) == [[-long], [long]]


def test_a_wrong_arity_in_the_last_job_pushes_nothing(config: Config, r: redis.Redis) -> None:
    @wurk.job(name="Pair", registry_=Registry())
    def pair(a: int, b: int) -> None:
        pass

    args = [[i, i] for i in range(1999)] + [[1]]
    with pytest.raises(ArgumentError, match=r"in args\[1999\]"):
        Client(config).push_bulk({"class": "Pair", "args": args})
    assert r.dbsize() == 0


def test_a_bad_shared_field_pushes_nothing(config: Config, r: redis.Redis) -> None:
    with pytest.raises(TypeError, match="queue"):
        Client(config).push_bulk({"class": "Bulk", "queue": 5, "args": [[1]] * 1500})
    with pytest.raises(ValueError, match="JSON compliant"):
        Client(config).push_bulk({"class": "Bulk", "x": float("inf"), "args": [[1]] * 1500})
    assert r.dbsize() == 0


def test_a_bulk_write_whose_reply_was_lost_is_reported_as_maybe_landed(
        proxy: FaultProxy, r: redis.Redis) -> None:
    config = Config(redis_url=proxy.url, redis_connect_timeout=0.3, redis_retry_base=0.01,
                    redis_retry_attempts=1, log_level="warning")
    client = Client(config, buffered=False, drain_spool=False)
    client.push({"class": "Bulk", "args": ["warm"]})
    proxy.drop_next_reply()  # Redis wrote the slice; the client never hears back
    with capture_logs() as logs, pytest.raises(wurk.PushOutcomeUnknown) as lost:
        client.push_bulk({"class": "Bulk", "args": [[i] for i in range(5)]})
    assert len(lost.value.jids) == 5 and lost.value.queue == "default"
    [warning] = [e for e in logs if e["event"] == "client.write_outcome_unknown"]
    assert warning["count"] == 5 and len(warning["jids"]) == 5
    assert r.llen(keys.queue("default")) == 6  # it did land

    async def main() -> list[dict[str, Any]]:
        async with wurk.AsyncClient(config, buffered=False) as aclient:
            await aclient.push({"class": "Bulk", "args": ["warm"]})
            proxy.drop_next_reply()
            with capture_logs() as alogs, pytest.raises(wurk.PushOutcomeUnknown):
                await aclient.push_bulk({"class": "Bulk", "args": [[i] for i in range(3)]})
        return alogs

    alogs = asyncio.run(main())
    assert [e["count"] for e in alogs if e["event"] == "client.write_outcome_unknown"] == [3]
    assert r.llen(keys.queue("default")) == 10

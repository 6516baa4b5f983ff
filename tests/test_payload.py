"""Payload helpers: timestamps, scores, parsing, jids and JSON output."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import redis

from wurk.wire import payload
from wurk.wire.payload import (
    ArgumentError,
    PayloadError,
    check_args,
    dumps,
    loads_job,
    new_jid,
    now_stamp,
    score,
    to_seconds,
)

# -- to_seconds ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1796022178.306, 1796022178.306),    # Sidekiq 6/7 float seconds
        (1796022178306, 1796022178.306),     # Sidekiq 8 integer ms
        (1796022178, 1796022178.0),          # a hand-written integer of seconds
        (4_102_444_800, 4_102_444_800.0),    # the boundary itself is still seconds
        (4_102_444_801, 4_102_444.801),      # just past it is ms
        (1.796e12, 1.796e12),                # a float is always seconds
        (0, 0.0),
        (12.5, 12.5),
    ],
)
def test_to_seconds(value: float, expected: float) -> None:
    got = to_seconds(value)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("value", [True, False, None, "1796022178", "1.5", [1], {"a": 1},
                                   10**400])
def test_to_seconds_rejects_non_numbers(value: Any) -> None:
    assert to_seconds(value) is None


# -- now_stamp -----------------------------------------------------------------


def test_now_stamp_float_seconds() -> None:
    assert now_stamp("float", 1796022178.306) == 1796022178.306
    before = time.time()
    stamp = now_stamp("float")
    after = time.time()
    assert isinstance(stamp, float)
    assert before <= stamp <= after
    # Even a whole second is written with a fraction.
    assert json.dumps(now_stamp("float", 1796022178.0)) == "1796022178.0"


def test_now_stamp_integer_ms() -> None:
    stamp = now_stamp("ms", 1796022178.3069)
    assert stamp == 1796022178306
    assert type(stamp) is int
    assert json.dumps(stamp) == "1796022178306"
    before = int(time.time() * 1000)
    live = now_stamp("ms")
    after = int(time.time() * 1000)
    assert type(live) is int
    assert before <= live <= after
    assert to_seconds(live) == pytest.approx(live / 1000)


# -- score -------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [1796022183.0620334, 1796022183.0, 1.5, 1700000000.123456])
def test_score_round_trips_as_a_string(seconds: float) -> None:
    text = score(seconds)
    assert isinstance(text, str)
    assert re.fullmatch(r"\d+\.\d+", text)
    assert float(text) == seconds


def test_score_of_an_int_is_written_as_a_float() -> None:
    assert score(5) == "5.0"
    assert score(1796022183) == "1796022183.0"


def test_score_round_trips_through_redis(r: redis.Redis) -> None:
    when = 1796022183.0620334
    r.execute_command("ZADD", "schedule", score(when), "member")
    assert r.zscore("schedule", "member") == when
    assert float(r.zrange("schedule", 0, -1, withscores=True)[0][1]) == when


# -- loads_job ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("not json at all", "not JSON"),
        ("", "not JSON"),
        ('{"class":"A","args":[]', "not JSON"),
        (b"\xff\xfe\xfa", "not JSON"),
        ("[1,2]", "not a JSON object"),
        ('"a string"', "not a JSON object"),
        ("null", "not a JSON object"),
        ("42", "not a JSON object"),
        ("{}", "class"),
        ('{"args":[]}', "class"),
        ('{"class":"A"}', "args"),
        ('{"class":1,"args":[]}', "class"),
        ('{"class":"A","args":{"a":1}}', "args"),
        ('{"class":"A","args":"x"}', "args"),
        # Not JSON, though Python's json module reads them: they could never be written back.
        ('{"class":"A","args":[NaN]}', "NaN is not JSON"),
        ('{"class":"A","args":[Infinity]}', "Infinity is not JSON"),
        ('{"class":"A","args":[],"x":-Infinity}', "-Infinity is not JSON"),
        ('{"class":"A","args":[],"retry_count":1e400}', "1e400 is out of range"),
        ('{"class":"A","args":[-1.5e999]}', "out of range"),
        ("[" * 100_000, "nested too deep"),
        ('{"class":"A","args":' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deep"),
    ],
)
def test_loads_job_errors(raw: str | bytes, why: str) -> None:
    with pytest.raises(PayloadError, match=why):
        loads_job(raw)


def test_payload_error_is_a_value_error() -> None:
    assert issubclass(PayloadError, ValueError)


def test_loads_job_keeps_every_key_in_order() -> None:
    raw = ('{"retry":true,"queue":"default","bid":"b1","class":"WurkEcho",'
           '"args":[1,"two",{"three":3}],"jid":"f24f20b2e4a09e8a29747db5",'
           '"created_at":1796022177.8188896,"enqueued_at":1796022177.8190498,"zz":null}')
    job = loads_job(raw)
    assert list(job) == ["retry", "queue", "bid", "class", "args", "jid", "created_at",
                         "enqueued_at", "zz"]
    assert job["args"] == [1, "two", {"three": 3}]
    assert dumps(job) == raw
    assert loads_job(raw.encode()) == job


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_loads_job_reads_every_encoding_json_allows(encoding: str) -> None:
    text = '{"class":"Jöb","args":["ünï",1.5]}'
    assert loads_job(text.encode(encoding)) == {"class": "Jöb", "args": ["ünï", 1.5]}


def test_loads_job_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(PayloadError, match="not JSON"):
        loads_job(b'{"class":"\xff","args":[]}')


# -- new_jid -----------------------------------------------------------------


def test_new_jid_format_and_uniqueness() -> None:
    jids = [new_jid() for _ in range(5000)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", j) for j in jids)
    assert len(set(jids)) == len(jids)


# -- dumps -------------------------------------------------------------------


def test_dumps_is_compact() -> None:
    assert dumps({"a": 1, "b": [1, 2, {"c": None}], "d": True}) == \
        '{"a":1,"b":[1,2,{"c":null}],"d":true}'


def test_dumps_keeps_non_ascii_unescaped() -> None:
    text = dumps({"name": "Zoë", "city": "東京", "emoji": "🎉"})
    assert text == '{"name":"Zoë","city":"東京","emoji":"🎉"}'
    assert "\\u" not in text


def test_dumps_refuses_nan() -> None:
    with pytest.raises(ValueError):
        dumps({"x": float("nan")})


def test_dumps_writes_floats_with_a_fraction() -> None:
    assert dumps({"created_at": 1796022178.0}) == '{"created_at":1796022178.0}'


# -- check_args ----------------------------------------------------------------


def test_check_args_accepts_json_native() -> None:
    check_args([None, True, 1, 2**70, 1.5, "s", [1, [2]], {"k": {"n": [None]}}])


def test_check_args_error_names_path_and_type() -> None:
    with pytest.raises(ArgumentError) as err:
        check_args([1, {"when": {"at": object()}}])
    message = str(err.value)
    assert "args[1]['when']['at']" in message
    assert "object" in message
    assert issubclass(ArgumentError, TypeError)


def test_check_args_names_non_string_key() -> None:
    with pytest.raises(ArgumentError, match=r"args\[0\] has a non-string key 1"):
        check_args([{1: "a"}])


def test_module_exports_errors() -> None:
    assert payload.ArgumentError is ArgumentError

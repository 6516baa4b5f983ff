"""Keyword arguments end to end, and pushes refused for the wrong JSON type.

A push may give keywords (``welcome.perform_async(42, address="...")``): the
payload carries them as a trailing object with ``"kwargs": true``, a worker
calls the job with them, and a positional push writes what it always wrote.
Where a parameter is annotated with JSON types, a value of another type is
refused at the push (``wurk.ArgumentError``, nothing in Redis), unless the
job says ``check_types=False``.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Optional, Union

import cli_workers
import pytest
import redis
from cli_workers import Worker
from waiting import wait_for

import wurk
from wurk.api.records import JobRecord
from wurk.push import signatures
from wurk.push.job import JobFunction
from wurk.settings.config import Config
from wurk.web.present import args_text
from wurk.wire.payload import dumps, loads_job

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
Define = Callable[..., JobFunction[..., Any]]

# The jobs as the worker defines them: each writes what it was called with.
TYPED_JOBS = textwrap.dedent("""
    import json
    import os

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    def _record(tag, *args, **kwargs):
        _r.rpush("typed:done", json.dumps({"tag": tag, "args": list(args), "kwargs": kwargs}))


    @wurk.job(name="typed_welcome")
    def welcome(user_id: int, *, address: str, greeting: str = "hi"):
        _record("welcome", user_id, address=address, greeting=greeting)


    @wurk.job(name="typed_nap")
    async def nap(tag: str, *, seconds: float = 0.0):
        _record("nap", tag, seconds=seconds)


    class Charge(wurk.Job, name="typed_charge"):
        def perform(self, order_id: str, cents: int = 0, *, note: str = ""):
            _record("charge", order_id, cents=cents, note=note)


    @wurk.job(name="typed_flaky", retry=3)
    def flaky(n: int, *, label: str):
        raise RuntimeError("fails, so its retry entry can be read")
""")


# The same jobs as this (pushing) process defines them.
@wurk.job(name="typed_welcome")
def welcome(user_id: int, *, address: str, greeting: str = "hi") -> None:
    pass


@wurk.job(name="typed_nap")
async def nap(tag: str, *, seconds: float = 0.0) -> None:
    pass


class Charge(wurk.Job, name="typed_charge"):
    def perform(self, order_id: str, cents: int = 0, *, note: str = "") -> None:
        pass


@wurk.job(name="typed_flaky", retry=3)
def flaky(n: int, *, label: str) -> None:
    pass


@pytest.fixture
def typed_worker(r: redis.Redis, spawn: Callable[..., Worker],
                 jobs_dir: Path) -> Callable[..., Worker]:
    (jobs_dir / "typed_jobs.py").write_text(TYPED_JOBS, encoding="utf-8")
    return lambda *args: spawn("-r", "typed_jobs", "-c", "2", *args)


def done(r: redis.Redis, count: int) -> list[dict[str, Any]]:
    wait_for(lambda: r.llen("typed:done") >= count, timeout=30, what=f"{count} jobs run")
    return sorted((json.loads(raw) for raw in r.lrange("typed:done", 0, -1)),
                  key=lambda call: json.dumps(call, sort_keys=True))


def call(tag: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"tag": tag, "args": list(args), "kwargs": kwargs}


EXPECTED = sorted([
    call("welcome", 42, address="ada@example.com", greeting="hi"),
    call("welcome", 43, address="bob@example.com", greeting="hello"),
    call("welcome", 1, address="a@example.com", greeting="hi"),
    call("welcome", 2, address="b@example.com", greeting="yo"),
    call("nap", "n1", seconds=0.01),
    call("nap", "n2", seconds=0.0),
    call("charge", "o-1", cents=500, note="gift"),
    call("charge", "o-2", cents=5, note=""),
    call("charge", "o-3", cents=1, note=""),
    call("charge", "o-4", cents=0, note="bulk"),
], key=lambda one: json.dumps(one, sort_keys=True))


def push_every_kind() -> None:
    welcome.perform_async(42, address="ada@example.com")
    welcome.perform_in(0.2, 43, address="bob@example.com", greeting="hello")
    welcome.perform_bulk([welcome.args(1, address="a@example.com"),
                          welcome.args(2, address="b@example.com", greeting="yo")])
    nap.perform_async("n1", seconds=0.01)
    nap.perform_async("n2")
    Charge.perform_async("o-1", cents=500, note="gift")
    Charge.set(retry=False).perform_async("o-2", 5)
    Charge.perform_bulk([["o-3", 1], Charge.args("o-4", note="bulk")])


@pytest.mark.usefixtures("config")
@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_worker_calls_each_job_with_the_keywords_it_was_pushed_with(
        r: redis.Redis, typed_worker: Callable[..., Worker], executor: str) -> None:
    push_every_kind()
    worker = typed_worker("--executor", executor)
    assert done(r, len(EXPECTED)) == EXPECTED, worker.stderr()


@pytest.mark.usefixtures("config")
def test_a_retried_keyword_job_keeps_its_keywords(
        r: redis.Redis, typed_worker: Callable[..., Worker]) -> None:
    jid = flaky.perform_async(7, label="x")
    worker = typed_worker()
    [raw] = wait_for(lambda: r.zrange("retry", 0, -1), timeout=30, what="the retry entry")
    entry = json.loads(raw)
    assert (entry["jid"], entry["args"], entry["kwargs"]) == (jid, [7, {"label": "x"}], True)
    assert entry["error_class"] == "RuntimeError", worker.stderr()


@pytest.mark.usefixtures("config")
def test_a_marker_with_no_keywords_calls_by_position_and_kills_no_unknown_class(
        r: redis.Redis, typed_worker: Callable[..., Worker]) -> None:
    # Another client's payload: the marker has no object to mark. A Ruby worker
    # on the queue would run it; here it is called by position, not killed.
    def marked(cls: str, jid: str) -> str:
        return json.dumps({"class": cls, "args": [1], "kwargs": True, "queue": "default",
                           "jid": jid, "retry": 3, "created_at": time.time(),
                           "enqueued_at": time.time()})
    r.lpush("queue:default", marked("typed_welcome", "a" * 24), marked("RubyOnly", "b" * 24))
    assert loads_job(marked("typed_welcome", "a" * 24))["args"] == [1]
    typed_worker()
    entries = wait_for(lambda: r.zcard("retry") == 2 and r.zrange("retry", 0, -1),
                       timeout=30, what="both in retry")
    by_jid = {json.loads(e)["jid"]: json.loads(e) for e in entries}
    # typed_welcome(1) lacks its keyword-only address: a job's own TypeError.
    assert by_jid["a" * 24]["error_class"] == "TypeError"
    assert by_jid["b" * 24]["class"] == "RubyOnly"
    assert r.zcard("dead") == 0 and r.llen("typed:done") == 0


# -- the payload ----------------------------------------------------------------------


def queued(r: redis.Redis) -> list[str]:
    return list(reversed(r.lrange("queue:default", 0, -1)))


def test_a_keyword_push_writes_a_trailing_object_and_the_marker(config: Config,
                                                              r: redis.Redis) -> None:
    welcome.perform_async(42, address="ada@example.com")
    [payload] = [json.loads(raw) for raw in queued(r)]
    # Only what the push gave: a default is the worker's to fill in.
    assert payload["args"] == [42, {"address": "ada@example.com"}]
    assert payload["kwargs"] is True


def test_a_positional_push_writes_the_payload_it_always_wrote(config: Config,
                                                              r: redis.Redis) -> None:
    Charge.set(queue="default").perform_async("o-1", 500)
    # The path every push took before keywords: Client.push_job.
    wurk.Client.default().push_job(Charge.wurk_name, ["o-1", 500], Charge.wurk_options)
    verb, before = queued(r)
    mine = json.loads(verb)
    assert "kwargs" not in mine
    theirs = json.loads(before)
    for stamp in ("jid", "created_at", "enqueued_at"):
        mine[stamp] = theirs[stamp]
    assert dumps(mine) == before  # same fields, same order, same bytes


def test_a_bulk_push_of_positional_lists_writes_no_marker(config: Config,
                                                          r: redis.Redis) -> None:
    Charge.perform_bulk([["o-1", 1], Charge.args("o-2", 2)])
    payloads = [json.loads(raw) for raw in queued(r)]
    assert [p["args"] for p in payloads] == [["o-1", 1], ["o-2", 2]]
    assert not any("kwargs" in p for p in payloads)


def test_a_bulk_push_checks_each_job_against_its_signature_once(
        config: Config, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check is the client-side cost of a typed push: a bulk push pays it
    # once per job, in the pipeline's whole-push check, not again in the verb.
    checked: list[int] = []
    real = signatures.Arity.check

    def counted(self: signatures.Arity, *args: Any, **kwargs: Any) -> None:
        checked.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(signatures.Arity, "check", counted)
    Charge.perform_bulk([["o-1", 1], Charge.args("o-2", 2, note="n")])
    assert len(queued(r)) == 2
    assert len(checked) == 2
    with pytest.raises(wurk.ArgumentError, match=r"must be int.* in args\[1\]"):
        Charge.perform_bulk([["o-3", 3], ["o-4", "4"]])
    assert len(queued(r)) == 2  # a bad job pushes nothing


def test_a_unique_call_locks_one_key_alone_or_in_a_bulk_push_with_keywords(
        config: Config, r: redis.Redis, define: Define) -> None:
    # A bulk push that gives keywords to some jobs writes {} for the others:
    # f(3) is still f(3), so its lock must be the one a push of f(3) alone took.
    def once(n: int, *, label: str = "") -> None:
        pass

    job = define(once, unique_for=600)
    assert job.perform_async(3) is not None
    pushed = job.perform_bulk([job.args(3), job.args(4, label="four")])
    assert len(pushed) == 1
    assert len(queued(r)) == 2
    assert [json.loads(raw)["args"] for raw in queued(r)] == [[3], [4, {"label": "four"}]]
    assert job.perform_async(4, label="four") is None


def test_a_raw_push_with_the_marker_is_checked_like_a_verb(config: Config,
                                                           r: redis.Redis) -> None:
    client = wurk.Client(config)
    client.push_bulk({"class": welcome.name, "args": [[1, {"address": "x"}]], "kwargs": True})
    with pytest.raises(wurk.ArgumentError, match=r"needs keyword argument 'address' in args\[0\]"):
        client.push_bulk({"class": welcome.name, "args": [[1, {}]], "kwargs": True})
    with pytest.raises(wurk.ArgumentError, match=r"last argument in args\[0\] is not an object"):
        client.push_bulk({"class": welcome.name, "args": [[1]], "kwargs": True})
    with pytest.raises(wurk.ArgumentError, match="not an object of keywords"):
        client.push({"class": welcome.name, "args": [1], "kwargs": True})
    assert r.llen("queue:default") == 1


def test_a_parameter_named_like_a_verbs_time_is_taken_by_keyword(config: Config,
                                                                  r: redis.Redis,
                                                                  define: Define) -> None:
    def remind(when: str, seconds: int) -> None:
        pass

    job = define(remind)
    job.perform_in(30, seconds=5, when="later")
    job.perform_at(2_000_000_000, "soon", seconds=1)
    assert sorted(json.loads(raw)["args"][-1]["seconds"]
                  for raw in r.zrange("schedule", 0, -1)) == [1, 5]


def test_the_dashboard_shows_keywords_as_names(config: Config, r: redis.Redis) -> None:
    welcome.perform_async(42, address="ada@example.com")
    Charge.perform_async("o-1", 500)
    keyed, positional = (JobRecord(raw, config=config) for raw in queued(r))
    assert args_text(keyed) == '42, address="ada@example.com"'
    assert args_text(positional) == '"o-1", 500'


# -- refused by the job's signature and annotations ------------------------------------


@pytest.fixture
def nothing_pushed(r: redis.Redis) -> Iterator[None]:
    yield
    assert r.keys("*") == [], "a refused push wrote to Redis"


def add(a: int, b: int) -> int:
    return a + b


@pytest.mark.usefixtures("config", "nothing_pushed")
def test_every_verb_refuses_a_value_of_the_wrong_json_type(define: Define) -> None:
    job = define(add)
    verbs = [lambda: job.perform_async("1", "2"), lambda: job.perform_in(30, "1", 2),
             lambda: job.perform_at(2_000_000_000, 1, b="2"),
             lambda: job.set(queue="other").perform_async(1, "2"),
             lambda: job.perform_bulk([[1, 2], ["1", 2]]),
             lambda: job.perform_bulk([job.args(1, b="2")]),
             lambda: wurk.Client.default().push_bulk({"class": job.name, "args": [["1", 2]]})]
    for push in verbs:
        with pytest.raises(wurk.ArgumentError, match=r"argument '[ab]' must be int, got str"):
            push()


@pytest.mark.usefixtures("config", "nothing_pushed")
def test_a_keyword_the_job_does_not_take_is_refused(define: Define) -> None:
    job = define(add)
    for kwargs, problem in [({"c": 1}, "has no parameter 'c'"),
                            ({"a": 1}, "got 'a' both by position and by keyword"),
                            ({}, "takes 2 arguments, got 1")]:
        with pytest.raises(wurk.ArgumentError, match=problem):
            job.perform_async(1, **kwargs)
    with pytest.raises(wurk.ArgumentError, match="needs argument 'b'"):
        job.perform_async(a=1)


class Model:
    """A class of the application's: how it travels is the application's business."""


def everything(n: int, ratio: float, name: str, flag: bool, nothing: None,
               items: list[int], table: dict[str, str], maybe: int | None,
               either: Union[int, str], old: Optional[str],  # noqa: UP007, UP045 - the old forms
               mode: Literal["a", "b"],
               untyped, anything: Any, model: Model, either_model: int | Model,
               *rest: str, **extra: float) -> None:
    pass


GOOD = {"n": 1, "ratio": 2, "name": "x", "flag": False, "nothing": None, "items": [1, 2],
        "table": {"k": "v"}, "maybe": None, "either": "s", "old": None, "mode": "b",
        "untyped": object, "anything": {"x": [1]}, "model": "any JSON", "either_model": "s"}
WRONG = [("n", True), ("n", 1.5), ("ratio", "2"), ("ratio", False), ("name", 1),
         ("flag", 0), ("nothing", 0), ("items", [1, "2"]), ("items", {}),
         ("table", {"k": 1}), ("table", []), ("maybe", "1"), ("either", 1.5), ("old", 1),
         ("mode", "c"), ("mode", True)]


@pytest.mark.usefixtures("config", "nothing_pushed")
@pytest.mark.parametrize(("param", "value"), WRONG)
def test_json_annotations_refuse_another_type(define: Define, param: str, value: Any) -> None:
    job = define(everything)
    with pytest.raises(wurk.ArgumentError, match=f"argument '{param}' must be"):
        job.perform_async(**{**GOOD, "untyped": 1, param: value})


@pytest.mark.usefixtures("config")
def test_json_annotations_take_their_type_and_others_take_anything(
        r: redis.Redis, define: Define) -> None:
    job = define(everything)
    job.perform_async(**{**GOOD, "untyped": [1]})
    job.perform_async(*[{**GOOD, "untyped": 1}[key] for key in GOOD], "r1", "r2", x=1.5, y=2)
    with pytest.raises(wurk.ArgumentError, match=r"argument 'rest\[1\]' must be str"):
        job.perform_async(*[{**GOOD, "untyped": 1}[key] for key in GOOD], "r1", 2)
    with pytest.raises(wurk.ArgumentError, match="argument 'z' must be float"):
        job.perform_async(**{**GOOD, "untyped": 1}, z="no")
    assert r.llen("queue:default") == 2


@pytest.mark.usefixtures("config")
def test_check_types_false_lets_any_json_through(r: redis.Redis, define: Define) -> None:
    loose = define(add, check_types=False)
    loose.perform_async("1", "2")

    class Loose(wurk.Job, name="typed_loose", check_types=False):
        def perform(self, a: int) -> None:
            pass

    Loose.perform_async("1")
    assert r.llen("queue:default") == 2
    with pytest.raises(wurk.ArgumentError, match="takes 2 arguments"):
        loose.perform_async("1")  # the count is still checked
    with pytest.raises(TypeError, match="check_types is declared with the job"):
        define(add).set(check_types=False)
    with pytest.raises(TypeError, match="check_types must be true or false"):
        define(add, check_types="no")


def test_string_annotations_are_resolved_and_unresolvable_ones_left_unchecked(
        config: Config, r: redis.Redis) -> None:
    namespace: dict[str, Any] = {"wurk": wurk}
    # A module of its own, with postponed annotations and a name defined later.
    exec(textwrap.dedent("""
        from __future__ import annotations

        @wurk.job(name="typed_postponed")
        def postponed(count: int, later: Later, items: list[Later]) -> None:
            pass
    """), namespace)
    job = namespace["postponed"]
    try:
        with pytest.raises(wurk.ArgumentError, match="argument 'count' must be int"):
            job.perform_async("1", 2, [3])
        job.perform_async(1, "a Later, not yet defined", [3])
        assert r.llen("queue:default") == 1
    finally:
        wurk.registry.discard("typed_postponed")

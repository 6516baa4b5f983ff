"""Keyword payloads under attack: what a job receives is what was pushed, and a
payload another client wrote ends in exactly one clear place.

1. Property tests (hypothesis): a push through the verbs (``perform_async``,
   ``perform_bulk``) of any JSON positional arguments and any keywords is
   read back from Redis and split into exactly those arguments and keywords,
   by ``keywords.split`` and by a real worker; a positional push whose last
   argument is a dict is never taken for keywords.
2. Hostile raw payloads LPUSHed by a plain redis client: keys no Python name
   has, keys that collide with parameters, many keys, a marker that is not
   ``true``, ``args`` that is not a list, a deep trailing object. Each job
   runs with sensible arguments or lands in retry or dead with the error
   that says why: none lost, none run twice, no processor thread lost.
3. Ruby Sidekiq 6.4's trailing hash (tests/interop/trailing_hash.rb): Ruby
   writes no marker, so a wurk job receives the hash by position.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_interop_support import module_redis_server, require_ruby, run_ruby
from tuning import tuned
from waiting import wait_for

import wurk
from wurk import registry
from wurk.api import DeadSet
from wurk.api.records import JobRecord
from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.runtime.middleware import current_job
from wurk.settings.config import Config
from wurk.web.present import args_text
from wurk.wire import keys, keywords
from wurk.wire.payload import loads_job

pytestmark = pytest.mark.timeout(180)
Define = Callable[..., JobFunction[..., Any]]
redis_server = module_redis_server  # this module's own server: exact counts below
QUEUE = "kwq"
RAN = "kw:ran"
GATHER = "kw:gathered"

# -- strategies ---------------------------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
objects = st.dictionaries(st.text(max_size=6), values, max_size=4)  # empty and nested included
names = (st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
         | st.sampled_from(["class", "self", "args", "kwargs", "job", "é", "日本", "_"]))
keyword_sets = st.dictionaries(names, values | objects, max_size=4)
# Positional lists that often end in a dict, the case most easily taken for keywords.
positionals = st.one_of(st.lists(values, max_size=4),
                        st.builds(lambda a, d: [*a, d], st.lists(values, max_size=3), objects))


def exact(value: Any) -> str:
    """Same values, same types (1 vs 1.0 vs True), same key order."""
    return json.dumps(value)


def queued(rb: redis.Redis) -> list[dict[str, Any]]:
    return [loads_job(raw) for raw in reversed(rb.lrange(f"queue:{QUEUE}", 0, -1))]


def received(args: Any, kwargs: dict[str, Any]) -> None:
    """What the running job was called with, by jid."""
    jid = (current_job() or {}).get("jid")
    wurk.Client.default().pool.call("RPUSH", RAN, json.dumps(
        {"jid": jid, "args": list(args), "kwargs": kwargs}))


def runs(r: redis.Redis) -> dict[str, list[dict[str, Any]]]:
    by_jid: dict[str, list[dict[str, Any]]] = {}
    for raw in r.lrange(RAN, 0, -1):
        one = json.loads(raw)
        by_jid.setdefault(one["jid"], []).append(one)
    return by_jid


@pytest.fixture
def kw_config(config: Config) -> Config:
    return tuned(config, queues=[QUEUE], concurrency=4, log_level="critical")


@pytest.fixture
def echo(kw_config: Config, define: Define) -> JobFunction[..., Any]:
    def echo(*args: Any, **kwargs: Any) -> None:
        received(args, kwargs)
    return define(echo, queue=QUEUE, retry=False)


# -- 1. the round trip --------------------------------------------------------------------------
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=positionals, kwargs=keyword_sets)
def test_a_push_reads_back_as_the_arguments_and_keywords_it_gave(
        echo: JobFunction[..., Any], rb: redis.Redis, args: list[Any],
        kwargs: dict[str, Any]) -> None:
    rb.delete(f"queue:{QUEUE}")
    echo.perform_async(*args, **kwargs)
    [payload] = queued(rb)
    got_args, got_kwargs = keywords.split(payload)
    assert (exact(list(got_args)), exact(dict(got_kwargs))) == (exact(args), exact(kwargs))
    if kwargs:
        assert payload["kwargs"] is True and exact(payload["args"]) == exact([*args, kwargs])
    else:  # the payload it always wrote: a trailing dict stays a positional argument
        assert "kwargs" not in payload and exact(payload["args"]) == exact(args)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(positionals, keyword_sets | st.just({})), min_size=1,
                      max_size=4))
def test_a_bulk_push_reads_back_as_each_jobs_arguments_and_keywords(
        echo: JobFunction[..., Any], rb: redis.Redis,
        calls: list[tuple[list[Any], dict[str, Any]]]) -> None:
    rb.delete(f"queue:{QUEUE}")
    # A call without keywords given as a plain list, the way most bulk pushes are.
    echo.perform_bulk([echo.args(*a, **k) if k else a for a, k in calls])
    payloads = queued(rb)
    assert len(payloads) == len(calls)
    for (args, kwargs), payload in zip(calls, payloads, strict=True):
        got_args, got_kwargs = keywords.split(payload)
        assert (exact(list(got_args)), exact(dict(got_kwargs))) == (exact(args), exact(kwargs))
        assert ("kwargs" in payload) is any(k for _, k in calls)


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(positionals, keyword_sets), min_size=1, max_size=4))
@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_worker_calls_the_job_with_exactly_what_was_pushed(
        kw_config: Config, define: Define, r: redis.Redis, executor: str,
        launch_with: Callable[..., Launcher], calls: list[tuple[list[Any], dict[str, Any]]],
        workers: dict[str, tuple[JobFunction[..., Any], Launcher]]) -> None:
    if executor not in workers:  # one worker per test, shared by its examples
        job = define(_async_echo if executor == "asyncio" else _sync_echo, queue=QUEUE,
                     retry=False)
        workers[executor] = (job, launch_with(tuned(kw_config, executor=executor)))
    job, _ = workers[executor]
    r.delete(RAN)
    jids = [job.perform_async(*args, **kwargs) for args, kwargs in calls]
    got = wait_for(lambda: len(r.lrange(RAN, 0, -1)) == len(jids) and runs(r), 30,
                   what="every push run")
    for jid, (args, kwargs) in zip(jids, calls, strict=True):
        assert jid is not None
        [run] = got[jid]
        assert (exact(run["args"]), exact(run["kwargs"])) == (exact(args), exact(kwargs))


@pytest.fixture
def workers() -> dict[str, tuple[JobFunction[..., Any], Launcher]]:
    return {}


def _sync_echo(*args: Any, **kwargs: Any) -> None:
    received(args, kwargs)


async def _async_echo(*args: Any, **kwargs: Any) -> None:
    received(args, kwargs)


# -- 2. hostile raw payloads --------------------------------------------------------------------
def open_job(*args: Any, **kwargs: Any) -> None:
    received(args, kwargs)


def strict_job(a: Any, b: Any = None) -> None:
    received([a, b], {})


async def open_async(*args: Any, **kwargs: Any) -> None:
    received(args, kwargs)


async def strict_async(a: Any, b: Any = None) -> None:
    received([a, b], {})


def gathered(everyone: int) -> bool:
    """Count this job in; whether all ``everyone`` jobs are running now."""
    pool = wurk.Client.default().pool
    pool.call("INCR", GATHER)
    return int(pool.call("GET", GATHER) or 0) >= everyone


def gather_job(n: int, *, everyone: int) -> None:
    met = gathered(everyone)
    deadline = time.monotonic() + 20
    while not met and time.monotonic() < deadline:
        time.sleep(0.02)
        met = int(wurk.Client.default().pool.call("GET", GATHER) or 0) >= everyone
    received([n], {"met": met})


async def gather_async(n: int, *, everyone: int) -> None:
    met = gathered(everyone)
    deadline = time.monotonic() + 20
    while not met and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        met = int(wurk.Client.default().pool.call("GET", GATHER) or 0) >= everyone
    received([n], {"met": met})


ODD_KEYS = {"1x": 1, "": 2, "a-b": 3, "__class__": 4, "null": 5, "true": 6, "0": 7, " ": 8,
            "é-\u00a0": 9, "a.b": {"x": [1]}}
MANY = {f"k{n}": n for n in range(20_000)}
NOT_TRUE: list[Any] = ["yes", "true", 1, 1.0, 0, None, {}, [], [True], False]


def deep(depth: int) -> str:
    return '{"d":' * depth + "1" + "}" * depth


# (what: open or strict job, the payload's "args" as JSON text, its other fields,
#  the outcome: ("ran", args, kwargs) | ("retry" | "dead", error class, words in the message))
Case = tuple[str, str, dict[str, Any], tuple[Any, ...]]


def hostile_cases() -> list[Case]:
    marked = {"kwargs": True}
    cases: list[Case] = [
        ("open", json.dumps([1, ODD_KEYS]), marked, ("ran", [1], ODD_KEYS)),
        ("strict", json.dumps([1, ODD_KEYS]), marked,
         ("retry", "TypeError", "unexpected keyword argument '1x'")),
        ("strict", json.dumps([1, {"a": 2}]), marked,
         ("retry", "TypeError", "multiple values for argument 'a'")),
        ("strict", json.dumps([{"a": 2, "b": 3}]), marked, ("ran", [2, 3], {})),
        ("strict", json.dumps([1, {"b": 2}]), marked, ("ran", [1, 2], {})),
        ("open", json.dumps([{"self": 1, "args": 2, "kwargs": 3, "job": 4, "cls": 5}]),
         marked, ("ran", [], {"self": 1, "args": 2, "kwargs": 3, "job": 4, "cls": 5})),
        ("open", json.dumps([7, MANY]), marked, ("ran", [7], MANY)),
        ("strict", json.dumps([7, MANY]), marked,
         ("retry", "TypeError", "unexpected keyword argument 'k0'")),
        # A marker with nothing to mark: every argument by position.
        ("open", "[]", marked, ("ran", [], {})),
        ("strict", "[]", marked, ("retry", "TypeError", "missing 1 required positional")),
        ("open", json.dumps([1, [2, {"b": 3}]]), marked, ("ran", [1, [2, {"b": 3}]], {})),
        ("open", json.dumps([1, {}]), marked, ("ran", [1], {})),
        ("open", json.dumps([{"x": 1}, {"y": 2}]), marked, ("ran", [{"x": 1}], {"y": 2})),
        # A trailing object as deep as JSON decodes, and one deeper.
        ("open", f"[1, {deep(400)}]", marked,
         ("ran", [1], json.loads(deep(400)))),
        ("open", f"[1, {deep(5000)}]", marked, ("dead", "PayloadError", "nested too deep")),
    ]
    for value in NOT_TRUE:  # only true marks: a trailing dict stays positional
        cases.append(("open", json.dumps([1, {"b": 2}]), {"kwargs": value},
                      ("ran", [1, {"b": 2}], {})))
        cases.append(("strict", json.dumps([1, {"b": 2}]), {"kwargs": value},
                      ("ran", [1, {"b": 2}], {})))
    for args in ['{"a": 1}', '"a"', "null", "5", '{"0": 1, "kwargs": true}']:
        cases.append(("open", args, marked, ("dead", "PayloadError", "a list 'args'")))
    return cases


def raw_payload(cls: str, jid: str, args: str, fields: dict[str, Any]) -> bytes:
    now = time.time()
    head = json.dumps({"class": cls, "queue": QUEUE, "jid": jid, "retry": 1,
                       "created_at": now, "enqueued_at": now, **fields})
    return f'{head[:-1]}, "args": {args}}}'.encode()


def whereabouts(rb: redis.Redis, jid: str, ran: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every place the job is: each run, the retry set, dead, a queue, a thread."""
    tagged = jid.encode()
    places = ["ran"] * len(ran.get(jid, []))
    for name, sset in (("retry", keys.RETRY), ("dead", keys.DEAD), ("schedule", keys.SCHEDULE)):
        places += [name for m in rb.zrange(sset, 0, -1) if tagged in m]
    held = [f"queue:{QUEUE}".encode(), *rb.keys("wurk:wip:*")]
    places += ["held" for k in held if rb.type(k) == b"list"
               for m in rb.lrange(k, 0, -1) if tagged in m]
    return places


@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_every_hostile_keyword_payload_ends_in_exactly_one_clear_place(
        kw_config: Config, define: Define, r: redis.Redis, rb: redis.Redis,
        launch_with: Callable[..., Launcher], executor: str) -> None:
    asynchronous = executor == "asyncio"
    jobs = {"open": define(open_async if asynchronous else open_job, queue=QUEUE),
            "strict": define(strict_async if asynchronous else strict_job, queue=QUEUE)}
    cases = {uuid.uuid4().hex[:24]: case for case in hostile_cases()}
    r.sadd("queues", QUEUE)
    rb.lpush(f"queue:{QUEUE}", *(raw_payload(jobs[what].name, jid, args, fields)
                                 for jid, (what, args, fields, _) in cases.items()))
    config = tuned(kw_config, executor=executor)
    launcher = launch_with(config)

    def settled() -> bool:
        ran = runs(r)
        return all(len(whereabouts(rb, jid, ran)) == 1 and whereabouts(rb, jid, ran) != ["held"]
                   for jid in cases) and not launcher.manager.in_flight.slots()
    wait_for(settled, 60, what="every hostile payload run, in retry or in dead")

    ran = runs(r)
    dead = {entry.value if isinstance(entry.value, bytes) else entry.value.encode(): entry
            for entry in DeadSet(config=config)}
    retry = {json.loads(m)["jid"]: json.loads(m) for m in rb.zrange(keys.RETRY, 0, -1)}
    for jid, (what, args, fields, outcome) in cases.items():
        shown = f"{what} {fields} {args[:80]}"
        [place] = whereabouts(rb, jid, ran)
        assert place == outcome[0], (shown, place, ran.get(jid), retry.get(jid))
        if place == "ran":
            [run] = ran[jid]
            assert (exact(run["args"]), exact(run["kwargs"])) == \
                (exact(outcome[1]), exact(outcome[2])), shown
        elif place == "retry":
            entry = retry[jid]
            assert entry["error_class"] == outcome[1], shown
            assert outcome[2] in entry["error_message"], (shown, entry["error_message"])
            assert entry["retry_count"] == 0, shown  # failed once, not spun
            assert entry["kwargs"] == fields["kwargs"], shown  # the marker kept for its retry
        else:
            [found] = [e for raw, e in dead.items() if jid.encode() in raw]
            assert found.error_class == outcome[1], shown
            assert outcome[2] in (found.error_message or ""), (shown, found.error_message)
    # Every processor is still there: as many jobs as the concurrency, each
    # waiting for all the others to start, all run.
    gather = define(gather_async if asynchronous else gather_job, queue=QUEUE, retry=False)
    after = [gather.perform_async(n, everyone=config.concurrency)
             for n in range(config.concurrency)]
    got = wait_for(lambda: set(after) <= set(runs(r)) and runs(r), 60,
                   what="a job per processor, run together after the hostile ones")
    assert [got[jid][0]["kwargs"]["met"] for jid in after] == [True] * len(after)


# -- 3. Ruby Sidekiq's trailing hash ------------------------------------------------------------
@pytest.fixture
def py_trailing(kw_config: Config) -> Iterator[None]:
    @wurk.job(name="PyTrailing")
    def trailing(*args: Any, **kwargs: Any) -> None:
        received(args, kwargs)

    try:
        yield
    finally:
        registry.discard("PyTrailing")


@pytest.mark.usefixtures("py_trailing")
def test_a_ruby_trailing_hash_reaches_a_wurk_job_by_position(
        config: Config, r: redis.Redis, rb: redis.Redis,
        launch_with: Callable[..., Launcher]) -> None:
    require_ruby()
    pushed = run_ruby(config.redis_url, "trailing_hash.rb")["pushed"]
    written = {p["jid"]: p for p in (loads_job(raw) for raw in rb.lrange("queue:default", 0, -1))}
    # Ruby's perform_async, keyword syntax included, writes a plain trailing hash.
    assert [("kwargs" in written[p["jid"]]) for p in pushed] == \
        [bool(p.get("marked")) for p in pushed]
    launch_with(tuned(config, queues=["default"], log_level="critical"))
    got = wait_for(lambda: len(r.lrange(RAN, 0, -1)) == len(pushed) and runs(r), 30,
                   what="the Ruby pushes run")
    for one in pushed:
        [run] = got[one["jid"]]
        # The hash by position, {} and all, as Ruby's perform(a, options) takes it;
        # a Ruby client that writes the marker itself gets keywords.
        args = one["args"]
        expected = (args[:-1], args[-1]) if one.get("marked") else (args, {})
        assert (exact(run["args"]), exact(run["kwargs"])) == \
            (exact(expected[0]), exact(expected[1])), one


# -- the verbs' own first parameter -------------------------------------------------------------
def test_a_keyword_named_self_or_cls_reaches_the_job(
        kw_config: Config, define: Define, rb: redis.Redis) -> None:
    # The verbs' self and cls are positional-only, as their seconds and when are,
    # so a job's parameter of that name is taken by keyword like any other.
    def named(*, self: str, cls: str = "") -> str:
        return self + cls

    job = define(named, queue=QUEUE)

    class Named(wurk.Job, name=f"t_named_{uuid.uuid4().hex[:10]}", queue=QUEUE):
        def perform(self, *, cls: str) -> None:
            pass

    try:
        assert job(self="a", cls="b") == "ab"
        job.perform_async(self="a")
        job.perform_bulk([job.args(self="b", cls="c")])
        Named.perform_async(cls="d")
        Named.perform_bulk([Named.args(cls="e")])
        [(_, first), (_, second), (_, third), (_, fourth)] = [
            keywords.split(p) for p in queued(rb)]
        assert [first, second, third, fourth] == [
            {"self": "a"}, {"self": "b", "cls": "c"}, {"cls": "d"}, {"cls": "e"}]
    finally:
        registry.discard(Named.wurk_name)


def test_the_dashboard_shows_a_key_that_is_no_python_name_as_python_passes_it(
        config: Config) -> None:
    payload = {"class": "x", "queue": QUEUE, "jid": "j" * 24, "kwargs": True,
               "args": [1, {"a=1, b": 2, "c": 3, "": 4}]}
    shown = args_text(JobRecord(json.dumps(payload), config=config))
    assert shown == '1, c=3, **{"a=1, b": 2, "": 4}'

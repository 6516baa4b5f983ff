"""Hostile payloads: whatever any client writes to a queue, the retry set or
the schedule ends run, in retry or in dead, and the jobs behind it run.

1. A property test (hypothesis) LPUSHes arbitrary byte strings and arbitrary
   JSON documents (any field of any type, lone surrogates, huge and deep
   values) onto a queue, into the retry set and into the schedule, against a
   real in-process worker of each executor, and accounts for every one.
2. Plain cases of the mechanism: a settle that raises something other than
   Redis trouble parks the job in dead with the reason; the scheduler moves a
   member PROMOTE could not be sent to dead; the reason is noted beside the
   raw bytes, trimmed with the dead set, shown and deleted by ``wurk dead``
   and the dashboard by a handle; the clients refuse lone surrogates.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import admin_cli
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from waiting import wait_for

import wurk
import wurk.web
from wurk.api import DeadSet
from wurk.push.job import JobFunction
from wurk.redis.runtime import runtime_for
from wurk.runtime.launcher import Launcher
from wurk.runtime.middleware import current_job
from wurk.runtime.retry import kill
from wurk.settings.config import Config
from wurk.wire import dead_notes, keys
from wurk.wire.payload import ArgumentError

pytestmark = pytest.mark.timeout(240)
cli = admin_cli.cli

QUEUE = "hp"
SURROGATES = ["\ud800", "\udbff", "\udc00", "\udcff", "\udfff"]
# Fields a worker reads, each of which a hostile payload may hold in any type.
FIELDS = ["class", "args", "jid", "retry", "retry_count", "at", "queue", "created_at",
          "enqueued_at", "failed_at", "retry_for", "retry_queue", "backtrace", "dead",
          "expiry", "deadline", "timeout", "hard_timeout", "result_ttl", "bid",
          "unique_for", "unique_until", "profile", "display_class", "wrapped", "tags",
          "error_class", "overrated", "encrypt"]
# Fields with which a job may end by design without a trace: dropped after
# failing (retry: false, dead: false) or unrun past its expiry or deadline.
DROPPING = ("retry", "dead", "expiry", "deadline", "retry_for")
_tags = itertools.count()


def tag() -> str:
    return f"hp{uuid.uuid4().hex[:10]}x{next(_tags)}"


# -- strategies ---------------------------------------------------------------------------------
texts = st.text(st.characters(), max_size=12) | st.sampled_from(SURROGATES) | st.builds(
    lambda a, s, b: a + s + b, st.text(max_size=4), st.sampled_from(SURROGATES),
    st.text(max_size=4))
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-10**80, 10**80)
           | st.floats(allow_nan=False, allow_infinity=False) | texts)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(texts, inner, max_size=4), max_leaves=12)


@st.composite
def documents(draw: st.DrawFn, classes: list[str]) -> tuple[str, bytes, bool]:
    """(tag, raw bytes, may be dropped by design) of a JSON object with any fields."""
    mark = tag()
    fields = draw(st.dictionaries(st.sampled_from(FIELDS) | texts, values, max_size=6))
    if draw(st.booleans()):  # often a job this worker knows, so the rest is what varies
        fields["class"] = draw(st.sampled_from(classes))
        fields.setdefault("args", draw(st.lists(values, max_size=3)))
    fields["hp"] = mark
    raw = json.dumps(fields)  # ensure_ascii: a surrogate is written as \udXXX
    return mark, raw.encode(), any(k in fields for k in DROPPING)


@st.composite
def garbage(draw: st.DrawFn, classes: list[str]) -> tuple[str, bytes, bool]:
    """Bytes no worker can run: not UTF-8, not JSON, not an object, too deep, too big."""
    mark = tag()
    cls = draw(st.sampled_from(classes))
    depth = draw(st.sampled_from([600, 3000, 100_000]))
    digits = draw(st.sampled_from([5000, 50_000]))
    kinds = [
        draw(st.binary(max_size=40)) + mark.encode(),
        b"\xff\xfe" + mark.encode() + draw(st.binary(max_size=8)),
        json.dumps([mark, draw(values)]).encode(),
        json.dumps(mark + draw(texts)).encode(),
        f'{{"class":"{cls}","args":{"[" * depth}{"]" * depth},"hp":"{mark}"}}'.encode(),
        f'{{"class":"{cls}","args":[{"9" * digits}],"hp":"{mark}"}}'.encode(),
        f'{{"class":"{cls}","args":[1e999],"hp":"{mark}"}}'.encode(),
        f'{{"class":"{cls}","args":[NaN],"hp":"{mark}"}}'.encode(),
        f'{{"class":"{cls}","args":["a\xed\xa0\x80"],"hp":"{mark}"}}'.encode("latin-1"),
    ]
    return mark, draw(st.sampled_from(kinds)), False


def placed(classes: list[str]) -> st.SearchStrategy[tuple[str, tuple[str, bytes, bool]]]:
    return st.tuples(st.sampled_from(["queue", "retry", "schedule"]),
                     documents(classes) | garbage(classes))


# -- the worker ---------------------------------------------------------------------------------
class Sinks:
    """Two registered jobs (sync and async) that record the ``hp`` tag of what they ran."""

    def __init__(self, r: redis.Redis, define: Callable[..., JobFunction[..., Any]]) -> None:
        def sink(*args: Any) -> None:
            r.rpush("hp:ran", str((current_job() or {}).get("hp")))

        async def asink(*args: Any) -> None:
            r.rpush("hp:ran", str((current_job() or {}).get("hp")))

        self.sync = define(sink, retry=False)
        self.asyncio = define(asink, retry=False)

    @property
    def names(self) -> list[str]:
        return [self.sync.name, self.asyncio.name]


def worker_config(redis_server: Any, executor: str, **extra: Any) -> Config:
    return Config(redis_url=redis_server.url, queues=[QUEUE], concurrency=5,
                  executor=executor, heartbeat_interval=0.2, poll_interval_average=0.1,
                  fetch_timeout=0.2, shutdown_timeout=2.0, log_level="critical", **extra)


# Both executors; and Sidekiq's own ways (BRPOP, the pop-then-push poller) once.
WORKERS = {"threads": ("threads", {}), "asyncio": ("asyncio", {}),
           "basic": ("threads", {"reliable_fetch": False, "reliable_scheduler": False})}


@pytest.fixture(params=list(WORKERS))
def hostile_worker(request: pytest.FixtureRequest, redis_server: Any, r: redis.Redis,
                   define: Callable[..., JobFunction[..., Any]],
                   launch_with: Callable[..., Launcher]) -> Iterator[tuple[Launcher, Sinks]]:
    sinks = Sinks(r, define)
    executor, extra = WORKERS[request.param]
    config = worker_config(redis_server, executor, **extra)
    wurk.configure(config)
    yield launch_with(config), sinks


def clear_outcomes(r: redis.Redis) -> None:
    r.delete("hp:ran", keys.RETRY, keys.SCHEDULE, keys.DEAD, keys.DEAD_NOTES,
             keys.DEAD_NOTES_AT, *r.keys("queue:*"))


def ended(rb: redis.Redis, mark: str, droppable: bool, now: float) -> bool:
    """Run, in retry, in dead, queued for a queue this worker does not read,
    scheduled for later, or (only where its payload says so) dropped."""
    tagged = mark.encode()
    if tagged in rb.lrange("hp:ran", 0, -1):
        return True
    for sset in (keys.RETRY, keys.DEAD):
        if any(tagged in m for m in rb.zrange(sset, 0, -1)):
            return True
    if any(tagged in m for m in rb.zrangebyscore(keys.SCHEDULE, now + 2, "+inf")):
        return True
    others = [k for k in rb.keys("queue:*") if k != f"queue:{QUEUE}".encode()]
    if any(tagged in m for k in others for m in rb.lrange(k, 0, -1)):
        return True
    return droppable and not held(rb, tagged)


def held(rb: redis.Redis, tagged: bytes) -> bool:
    """Still somewhere a worker of this queue has yet to finish with it."""
    lists = [f"queue:{QUEUE}".encode(), *rb.keys("wurk:wip:*")]
    if any(tagged in m for k in lists if rb.type(k) == b"list"
           for m in rb.lrange(k, 0, -1)):
        return True
    return any(tagged in m for m in rb.zrangebyscore(keys.SCHEDULE, "-inf", time.time()))


def nothing_stuck(r: redis.Redis, launcher: Launcher) -> bool:
    """No job left in the queue, held by a thread, or due in a set and not moved."""
    due = time.time() - 2
    return (r.llen(f"queue:{QUEUE}") == 0 and not launcher.manager.in_flight.slots()
            and not r.zrangebyscore(keys.RETRY, "-inf", due)
            and not r.zrangebyscore(keys.SCHEDULE, "-inf", due))


def noted(dead: DeadSet) -> bool:
    """Every dead entry says why it is there."""
    return all(entry.error_class and entry.error_message for entry in dead)


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_every_hostile_payload_ends_and_the_good_jobs_behind_run(
        data: st.DataObject, hostile_worker: tuple[Launcher, Sinks], r: redis.Redis,
        rb: redis.Redis) -> None:
    launcher, sinks = hostile_worker
    clear_outcomes(r)
    hostile = data.draw(st.lists(placed(sinks.names), min_size=1, max_size=8))
    now = time.time()
    r.sadd("queues", QUEUE)
    for where, (_, raw, _) in hostile:
        if where == "queue":
            rb.lpush(f"queue:{QUEUE}", raw)
        else:
            rb.zadd(where, {raw: now - 1})
    good = [tag() for _ in range(5)]
    for n, mark in enumerate(good):
        job = sinks.sync if n % 2 else sinks.asyncio
        wurk.Client.default().push({"class": job.name, "args": [], "queue": QUEUE, "hp": mark})
    wait_for(lambda: set(good) <= set(r.lrange("hp:ran", 0, -1)), 30,
             what="the good jobs behind the hostile ones run")
    for _, (mark, raw, droppable) in hostile:
        wait_for(lambda m=mark, d=droppable: ended(rb, m, d, now), 30,  # type: ignore[misc]
                 what=f"{raw[:120]!r} ends run, in retry or in dead")
    wait_for(lambda: nothing_stuck(r, launcher), 30, what="nothing left stuck")
    assert noted(DeadSet(config=launcher.config))


# -- the 12 + 100 case and the mechanism, plainly -----------------------------------------------
def surrogate_payloads(cls: str) -> list[bytes]:
    """As Python's json.dumps writes a surrogate-escaped filename, in jid, class and args."""
    name = b"report-\xff.txt".decode("utf-8", "surrogateescape")
    out = []
    for n in range(4):
        base = {"class": cls, "args": [f"bad-{n}"], "queue": QUEUE, "retry": True}
        out += [json.dumps({**base, "jid": f"{name}-{n}"}).encode(),
                json.dumps({**base, "class": f"{name}-{n}"}).encode(),
                json.dumps({**base, "args": [name, n]}).encode()]
    return out


def test_unwritable_payloads_go_to_dead_as_they_were_in_one_attempt(
        hostile_worker: tuple[Launcher, Sinks], r: redis.Redis, rb: redis.Redis) -> None:
    launcher, sinks = hostile_worker
    bad = surrogate_payloads(sinks.sync.name)
    rb.lpush(f"queue:{QUEUE}", *bad)
    good = [tag() for _ in range(20)]
    for mark in good:
        wurk.Client.default().push({"class": sinks.sync.name, "args": [], "queue": QUEUE,
                                    "hp": mark})
    wait_for(lambda: set(good) <= set(r.lrange("hp:ran", 0, -1)), 30, what="good jobs run")
    wait_for(lambda: rb.zcard("dead") == len(bad), 10, what="the bad ones in dead")
    assert set(rb.zrange("dead", 0, -1)) == set(bad)  # the bytes as they were pushed
    entries = list(DeadSet(config=launcher.config))
    assert {e.error_class for e in entries} == {"PayloadError"}
    assert all("lone surrogate" in (e.error_message or "") for e in entries)
    assert rb.zcard("retry") == 0
    # The last job's thread may still be settling it: wait, do not sample.
    wait_for(lambda: nothing_stuck(r, launcher), 30, what="nothing left stuck")


def test_a_settle_that_raises_a_defect_parks_the_job_and_goes_on(
        redis_server: Any, r: redis.Redis, rb: redis.Redis,
        define: Callable[..., JobFunction[..., Any]],
        launch_with: Callable[..., Launcher]) -> None:
    """A middleware leaves a lone surrogate in the failed job: its retry entry
    cannot be encoded, so the job goes to dead as fetched, with the reason."""
    sinks = Sinks(r, define)

    def spoil(job: dict[str, Any], queue: str, call: Callable[[], Any]) -> Any:
        if job.get("spoil"):
            job["note"] = "\udcff"
            raise RuntimeError("failed, and left something unwritable behind")
        return call()

    config = worker_config(redis_server, "threads", server_middleware=[spoil])
    wurk.configure(config)
    client = wurk.Client.default()
    spoiled = [client.push({"class": sinks.sync.name, "args": [n], "queue": QUEUE,
                            "spoil": True, "retry": 3}) for n in range(6)]
    good = [tag() for _ in range(10)]
    for mark in good:
        client.push({"class": sinks.sync.name, "args": [], "queue": QUEUE, "hp": mark})
    launcher = launch_with(config)
    wait_for(lambda: set(good) <= set(r.lrange("hp:ran", 0, -1)), 30, what="good jobs run")
    dead = DeadSet(config=config)
    wait_for(lambda: dead.size == len(spoiled), 15, what="the spoiled jobs parked in dead")
    for entry in dead:
        assert entry.jid in spoiled
        assert entry.item.get("note") is None  # the payload as fetched, not as left
        assert entry.error_class == "UnicodeEncodeError"
        assert "retry entry" in (entry.error_message or "")
    assert rb.zcard("retry") == 0
    # The last job's thread may still be settling it: wait, do not sample.
    wait_for(lambda: nothing_stuck(r, launcher), 30, what="nothing left stuck")


@pytest.mark.parametrize("sset", [keys.RETRY, keys.SCHEDULE])
def test_the_scheduler_moves_unwritable_members_to_dead_and_the_rest_on(
        sset: str, hostile_worker: tuple[Launcher, Sinks], r: redis.Redis,
        rb: redis.Redis) -> None:
    launcher, sinks = hostile_worker
    now = time.time() - 1
    bad = surrogate_payloads(sinks.sync.name)
    rb.zadd(sset, {raw: now - n for n, raw in enumerate(bad)})  # the oldest due first
    good = [tag() for _ in range(5)]
    rb.zadd(sset, {json.dumps({"class": sinks.sync.name, "args": [], "queue": QUEUE,
                               "hp": mark, "jid": mark}).encode(): now for mark in good})
    wait_for(lambda: set(good) <= set(r.lrange("hp:ran", 0, -1)), 30, what="good members run")
    wait_for(lambda: rb.zcard("dead") == len(bad), 10, what="the bad members in dead")
    assert set(rb.zrange("dead", 0, -1)) == set(bad)
    assert {e.error_class for e in DeadSet(config=launcher.config)} == {"PayloadError"}
    assert rb.zcard(sset) == 0


# -- notes: kept beside the bytes, trimmed with the set, shown and deleted -------------------------
def test_notes_are_trimmed_as_the_dead_set_is(config: Config, r: redis.Redis) -> None:
    small = Config(redis_url=config.redis_url, dead_max_jobs=5, dead_timeout=100.0)
    now = time.time()
    for n in range(12):
        kill(runtime_for(small), f"junk-{n}", now + n, reason=("PayloadError", f"junk {n}"))
    assert r.zcard("dead") <= 5
    assert r.hlen(keys.DEAD_NOTES) == r.zcard(keys.DEAD_NOTES_AT) == 5
    # The rest are past age.
    kill(runtime_for(small), "late", now + 1000, reason=("PayloadError", "late"))
    assert r.hkeys(keys.DEAD_NOTES) == [dead_notes.digest(b"late")]


def test_wurk_dead_lists_shows_and_deletes_raw_entries_by_handle(
        config: Config, r: redis.Redis, rb: redis.Redis, cli: admin_cli.Cli) -> None:
    raws = [b"\xff\xfe not even utf-8", json.dumps({"class": "X\udcff", "args": []}).encode(),
            json.dumps({"class": "Y", "args": [], "jid": "j\ud800"}).encode()]
    for n, raw in enumerate(raws):
        kill(runtime_for(config), raw, time.time() + n, reason=("PayloadError", f"reason {n}"))
    listed = cli("dead", "list", "--json").json["entries"]
    handles = [e["handle"] for e in listed]
    assert handles == [dead_notes.handle(raw) for raw in reversed(raws)]
    assert [e["error_message"] for e in listed] == ["reason 2", "reason 1", "reason 0"]
    table = cli("dead", "list")
    assert table.code == 0
    assert all(h in table.out for h in handles)
    shown = cli("dead", "show", handles[1])
    assert shown.code == 0
    assert "PayloadError: reason 1" in shown.out
    assert "X\\udcff" in shown.out
    gone = cli("dead", "delete", handles[0], handles[2], "--yes")
    assert gone.code == 0, gone.err
    assert rb.zrange("dead", 0, -1) == [raws[1]]
    assert r.hkeys(keys.DEAD_NOTES) == [dead_notes.digest(raws[1])]


def test_the_dashboard_shows_and_deletes_raw_entries(config: Config, r: redis.Redis,
                                                     rb: redis.Redis) -> None:
    raws = [b"\xff garbage", json.dumps({"class": "X\udcff", "args": ["\ud800"]}).encode()]
    for n, raw in enumerate(raws):
        kill(runtime_for(config), raw, time.time() + n, reason=("PayloadError", f"reason {n}"))
    with TestClient(wurk.web.app(config)) as web:
        page = web.get("/dead")
        assert page.status_code == 200
        assert "reason 0" in page.text and "reason 1" in page.text
        found = re.findall(r'name="key" value="([^"]+)"', page.text)
        assert [k.split("-", 1)[1] for k in found] == [dead_notes.handle(raw)
                                                        for raw in reversed(raws)]
        for key in found:
            assert web.get(f"/dead/{key}").status_code == 200
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf
        web.post(f"/dead/{found[0]}", data={"csrf": csrf.group(1), "action": "delete"})
    assert rb.zrange("dead", 0, -1) == [raws[0]]
    assert r.hkeys(keys.DEAD_NOTES) == [dead_notes.digest(raws[0])]


# -- the clients ------------------------------------------------------------------------------
UNWRITABLE_ITEMS = [
    {"class": "X\udcff", "args": []},
    {"class": "X", "args": ["file-\udcff.txt"]},
    {"class": "X", "args": [{"k\ud800": 1}]},
    {"class": "X", "args": [[[{"deep": ["\udfff"]}]]]},
    {"class": "X", "args": [], "queue": "q\ud800"},
    {"class": "X", "args": [], "jid": "j\udc00"},
    {"class": "X", "args": [], "tags": ["\udc80"]},
]


@pytest.mark.parametrize("item", UNWRITABLE_ITEMS)
def test_the_clients_refuse_lone_surrogates(config: Config, r: redis.Redis,
                                            item: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError, match="lone surrogate"):
        wurk.Client(config).push(item)
    # A bulk push makes its own jids: its item's jid is not written.
    bulk = {**item, "args": [item["args"], [1]]} if "jid" not in item else None
    if bulk is not None:
        with pytest.raises(ArgumentError, match="lone surrogate"):
            wurk.Client(config).push_bulk(bulk)

    async def push_async() -> None:
        async with wurk.AsyncClient(config) as client:
            with pytest.raises(ArgumentError, match="lone surrogate"):
                await client.push(item)
            if bulk is not None:
                with pytest.raises(ArgumentError, match="lone surrogate"):
                    await client.push_bulk(bulk)

    asyncio.run(push_async())
    assert r.keys("queue:*") == []


def test_perform_async_refuses_a_surrogate_escaped_filename(
        config: Config, r: redis.Redis, define: Callable[..., JobFunction[..., Any]]) -> None:
    job = define(lambda path: None)
    name = b"\xff.txt".decode("utf-8", "surrogateescape")
    with pytest.raises(ArgumentError, match=r"args\[0\]"):
        job.perform_async(name)
    assert job.perform_async("fine \u00e9\U0001f600") is not None  # real characters pass

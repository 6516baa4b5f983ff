"""Settling failures: nothing a failed job or Redis does loses it, spins it or ends a thread.

A failed job leaves its private list and lands in ``retry`` or ``dead`` in one
script (issue #11, items 1 and 3). These run real launchers against a real
redis-server, with a FaultProxy for outages and a server of its own at
maxmemory.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer, start_redis
from faultproxy import FaultProxy
from fetching import Gate, launch_gated, payload, private_lists, quiet_background, reliable, wip
from structlog.testing import capture_logs
from tuning import tuned
from waiting import EVENTUALLY, wait_for

from wurk.push.job import JobFunction
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.runtime.launcher import Launcher
from wurk.runtime.reaper import sweep
from wurk.runtime.retry import decode_backtrace
from wurk.runtime.settle import write
from wurk.runtime.work import Settlement
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import new_jid

Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


class Boom(RuntimeError):
    pass


def jids_in(rb: redis.Redis, *sets: str) -> list[str]:
    return [json.loads(m)["jid"] for key in sets for m in rb.zrange(key, 0, -1)]


def lost_of(rb: redis.Redis, identity: str, jids: list[str]) -> list[str]:
    """The jids found nowhere: not in retry, dead, a queue or a private list."""
    found = set(jids_in(rb, keys.RETRY, keys.DEAD))
    lists = [b"queue:default", *private_lists(rb, identity)]
    for key in lists:
        found.update(json.loads(raw)["jid"] for raw in rb.lrange(key, 0, -1))
    return [jid for jid in jids if jid not in found]


# -- the script ------------------------------------------------------------------------------


def test_settle_writes_only_if_this_runs_copy_is_still_claimed(
        rb: redis.Redis, config: Config) -> None:
    claimed = payload("SettleJob", "x")
    mine = wip("me", "default")
    rb.lpush(mine, claimed)
    rb.set(keys.pill("pilljid"), 1)
    entry = Settlement("retry", '{"class":"SettleJob","retry_count":0}', time.time() + 20)
    assert write(runtime_for(config), entry, mine, claimed, keys.pill("pilljid")) is True
    assert not rb.exists(mine) and not rb.exists(keys.pill("pilljid"))
    assert rb.zrange(keys.RETRY, 0, -1) == [entry.entry.encode()]
    # A replay (a lost reply), or a copy a stop already gave back: nothing more.
    rb.zrem(keys.RETRY, entry.entry)
    assert write(runtime_for(config), entry, mine, claimed) is False
    assert rb.zcard(keys.RETRY) == 0
    # Dead entries get Sidekiq's trims; "dropped" is just the removal.
    config = tuned(config, dead_max_jobs=2)
    for n in range(3):
        rb.lpush(mine, claimed)
        assert write(runtime_for(config), Settlement.dead(f"dead-{n}"), mine, claimed)
    assert rb.zrange(keys.DEAD, 0, -1) == [b"dead-2"]
    rb.lpush(mine, claimed)
    assert write(runtime_for(config), Settlement("dropped"), mine, claimed)
    assert not rb.exists(mine) and rb.zcard(keys.RETRY) == 0


# -- item 1a: an outage while jobs fail ------------------------------------------------------


class Failing:
    """Jobs that start, wait behind a gate, then raise; every run is recorded."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.runs: list[str] = []
        self.raised: list[str] = []
        self._lock = threading.Lock()

    def run(self, tag: str) -> None:
        with self._lock:
            self.runs.append(tag)
        self.gate.wait(10)
        with self._lock:
            self.raised.append(tag)
        raise Boom(tag)


def settle_attempts(logs: list[dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(e["jid"] for e in logs if e["event"] == "job.settle_failed")


def test_failures_during_an_outage_are_recorded_when_redis_returns(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    """Issue #11 item 1a: the retry write and the requeue failed, and once Redis
    was back the queued acknowledgement deleted the only copy (10 of 10 lost)."""
    count = 10
    # the pool gives up on each call at once
    config = quiet_background(config, proxy, concurrency=count, redis_retry_attempts=1,
                              redis_retry_base=0.05, redis_retry_cap=0.2)
    failing = Failing()
    job = define(failing.run)
    raws = [payload(job.name, f"j{n}") for n in range(count)]
    jids = [json.loads(raw)["jid"] for raw in raws]
    rb.lpush("queue:default", *raws)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    wait_for(lambda: len(failing.runs) == count)
    with capture_logs() as logs:
        proxy.refuse()
        proxy.half_close()
        t0 = time.monotonic()
        failing.gate.set()
        wait_for(lambda: len(failing.raised) == count)
        # The outage outlasts the pool's tries: each job's record is refused
        # at least twice. (The old code logged no such event: it gave up.)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(attempts := settle_attempts(logs)) == count
                     and min(attempts.values()) >= 2, timeout=5)
        proxy.heal()
        outage = time.monotonic() - t0
        wait_for(lambda: not rb.exists(mine), timeout=10)
    lost = lost_of(rb, launcher.identity, jids)
    assert lost == [], f"{len(lost)} of {count} jobs lost"
    assert sorted(jids_in(rb, keys.RETRY)) == sorted(jids)
    assert len(failing.runs) == count  # each ran once: nothing was requeued and rerun
    attempts = settle_attempts(logs)
    assert set(attempts) == set(jids)
    assert min(attempts.values()) >= 2
    # Backoff, not a spin: the pause between attempts is at least the 0.05 s base.
    assert max(attempts.values()) <= 2 + outage / 0.05
    assert not any(e["event"] in ("job.lost", "processor.error") for e in logs)
    launcher.stop()
    assert private_lists(rb, launcher.identity) == []


def test_a_stop_abandons_a_failure_it_cannot_record_and_the_reaper_returns_it(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    # a stop that waited on a reply would show
    config = quiet_background(config, proxy, redis_retry_attempts=1, redis_retry_base=0.05,
                              redis_retry_cap=0.2, redis_read_timeout=30.0, shutdown_timeout=0.5)
    failing = Failing()
    job = define(failing.run)
    raw = payload(job.name, "stuck")
    rb.lpush("queue:default", raw)
    launcher = launch()
    mine = wip(launcher.identity, "default")
    wait_for(lambda: failing.runs)
    with capture_logs() as logs:
        proxy.refuse()
        proxy.half_close()
        failing.gate.set()
        wait_for(lambda: any(e["event"] == "job.settle_failed" for e in logs))
        t0 = time.monotonic()
        launcher.stop()
        # The 0.5 s deadline and STOP_MARGIN, with room for a loaded machine,
        # not a 30 s read.
        assert time.monotonic() - t0 < 10.0
        # Said by the job's thread as it sees the stop, which may be just after.
        wait_for(lambda: any(e["event"] == "job.settle_abandoned" for e in logs), timeout=10)
    assert {"event": "job.settle_abandoned", "jid": json.loads(raw)["jid"],
            "queue": "default", "log_level": "warning"} in logs
    wait_for(lambda: not any(t.is_alive() for t in launcher.manager._threads))
    proxy.heal()
    # Never acknowledged and never written: the copy waits for the reaper.
    assert rb.lrange(mine, 0, -1) == [raw]
    assert rb.zcard(keys.RETRY) == 0
    r.delete(launcher.identity, keys.REAPER_LOCK)  # its heartbeat lapses
    assert sweep(runtime_for(config)) == 1
    assert rb.lrange("queue:default", 0, -1) == [raw]
    assert failing.runs == ["stuck"]


def test_a_malformed_payload_met_in_an_outage_reaches_dead_when_redis_returns(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        proxy: FaultProxy) -> None:
    """Sending a malformed payload to dead during an outage raised out of the
    processor and ended its thread; now it waits and retries like any failure."""
    config = quiet_background(config, proxy, redis_retry_attempts=1, redis_retry_base=0.05,
                              redis_retry_cap=0.2)
    gate, _, _, launcher = launch_gated(rb, define, launch, "running")
    mine = wip(launcher.identity, "default")
    assert gate.started.wait(EVENTUALLY)
    garbage = b'{"class": "X", "args": [NaN]}'
    rb.lpush("queue:default", garbage)
    assert reliable(launcher)._claim(1, []) == 1  # next in line for the busy thread
    with capture_logs() as logs:
        proxy.refuse()
        proxy.half_close()
        gate.release.set()
        with contextlib.suppress(AssertionError):  # the old code did not retry
            wait_for(lambda: sum(settle_attempts(logs).values()) >= 2, timeout=5)
        proxy.heal()
        wait_for(lambda: rb.zrange(keys.DEAD, 0, -1) == [garbage], timeout=5)
    assert any(e["event"] == "job.malformed" for e in logs)
    wait_for(lambda: not rb.exists(mine), timeout=5)  # the good job's ack went too
    assert all(t.is_alive() for t in launcher.manager._threads)
    assert not any(e["event"] in ("job.lost", "processor.error") for e in logs)


# -- item 1b: data the retry handler cannot use as it stands ---------------------------------


def raw_job(name: str, **fields: str) -> bytes:
    """A payload with some fields written as raw JSON text (null, 1e400, NaN...)."""
    text = json.dumps({"class": name, "args": [1], "jid": new_jid(), "queue": "default",
                       "retry": True})
    extra = "".join(f', "{key}": {value}' for key, value in fields.items())
    return (text[:-1] + extra + "}").encode()


def where(rb: redis.Redis, jid: str) -> tuple[str, dict[str, Any] | bytes] | None:
    for key in (keys.RETRY, keys.DEAD):
        for member in rb.zrange(key, 0, -1):
            try:
                entry = json.loads(member)
            except ValueError:
                return key, member
            if entry.get("jid") == jid:
                return key, entry
    return None


# (fields as JSON text, where the job ends, what its entry must show)
DATA_CASES = {
    "retry_count null": ({"retry_count": "null"}, "retry", {"retry_count": 0}),
    "retry_count false": ({"retry_count": "false"}, "retry", {"retry_count": 0}),
    "retry_count -1": ({"retry_count": "-1"}, "retry", {"retry_count": 0}),
    "retry_count 4.0": ({"retry_count": "4.0"}, "retry", {"retry_count": 5}),
    "retry_count abc": ({"retry_count": '"abc"'}, "dead", {"retry_count": 0}),
    "retry_count true": ({"retry_count": "true"}, "dead", {"retry_count": 0}),
    "retry_count 2.5": ({"retry_count": "2.5"}, "dead", {"retry_count": 0}),
    "retry_count 1e300": ({"retry_count": "1e300"}, "dead", {"retry_count": 0}),
    "retry_count 1e400": ({"retry_count": "1e400"}, "malformed", {}),
    "backtrace abc": ({"backtrace": '"abc"'}, "retry", {"error_backtrace": []}),
    "backtrace 2x": ({"backtrace": '"2x"'}, "retry", {"error_backtrace": 2}),
    "NaN argument": ({"args": "[NaN]"}, "malformed", {}),
    "Infinity argument": ({"args": "[-Infinity]"}, "malformed", {}),
    "failed_at 1e400 as an integer": (
        {"retry_for": "1e308", "retry_count": "0", "failed_at": "1" + "0" * 400},
        "retry", {"retry_count": 1}),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_unusable_payload_fields_end_in_retry_or_dead_without_spinning(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define, launch: Launch,
        case: str) -> None:
    """Issue #11 item 1b: each of these made the retry write fail; the job was
    requeued, run again and deleted by a stale acknowledgement (with a null
    retry_count, thousands of times a second).

    A null or missing retry_count is a first failure, as in Sidekiq 6.4.1's
    lib/sidekiq/job_retry.rb (``JobRetry#attempt_retry``, lines 154-159)::

        count = if msg["retry_count"]
          msg["retried_at"] = Time.now.to_f
          msg["retry_count"] += 1
        else
          msg["failed_at"] = Time.now.to_f
          msg["retry_count"] = 0
        end

    and a truthy backtrace other than true keeps
    ``exception.backtrace[0...msg["backtrace"].to_i]`` lines (lines 162-169),
    so "abc" keeps none. Any other retry_count that is not a count sends the job to dead
    with the reason in error_message; NaN, Infinity and numbers beyond a
    float are not JSON, so those payloads go to dead as received.
    """
    fields, expected, shows = DATA_CASES[case]
    config = tuned(config, concurrency=1)
    runs: list[int] = []

    def fail(n: int) -> None:
        runs.append(n)
        raise Boom("data")

    job = define(fail)
    probed: list[int] = []
    probe = define(lambda: probed.append(1))
    raw = raw_job(job.name, **fields)
    jid = raw.decode().split('"jid": "')[1][:24]
    rb.lpush("queue:default", raw)
    launcher = launch()
    if expected == "malformed":
        wait_for(lambda: rb.zrange(keys.DEAD, 0, -1) == [raw])
    else:
        found = wait_for(lambda: where(rb, jid), what=f"{jid} in retry or dead")
        assert found[0] == expected, found
        check_entry(found[1], shows, expected)
    # A later job runs on the one thread: the fetch went on past the settled
    # job, with every chance to take it again (a spin would show in runs).
    probe.perform_async()
    wait_for(lambda: probed, timeout=10, what="a later job run")
    assert runs == ([] if expected == "malformed" else [1])
    launcher.stop()
    assert private_lists(rb, launcher.identity) == []
    assert rb.llen("queue:default") == 0


def check_entry(entry: Any, shows: dict[str, Any], expected: str) -> None:
    assert isinstance(entry, dict)
    assert entry["error_class"] == "Boom"
    for key, value in shows.items():
        if key == "error_backtrace":
            lines = decode_backtrace(entry[key])
            assert lines == value if isinstance(value, list) else len(lines) == value
        else:
            assert entry[key] == value, entry
    if expected == "dead":
        assert entry["error_message"].startswith("data (wurk: retry_count ")
        assert entry["error_message"].endswith(" is not a count, so the job went to dead)")


# -- item 1b: the retry write at maxmemory ---------------------------------------------------


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    """A server of our own with a small maxmemory that refuses writes once full."""
    server = start_redis("--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
    yield server
    server.stop()


def fill(client: redis.Redis) -> int:
    """Write small keys until Redis refuses one for lack of memory; returns how many."""
    written = 0
    while True:
        pipe = client.pipeline(transaction=False)
        for n in range(written, written + 500):
            pipe.set(f"filler:{n}", "x" * 200)
        try:
            pipe.execute()
        except redis.exceptions.ResponseError as exc:
            assert "OOM" in str(exc) or "maxmemory" in str(exc)
            break
        written += 500
    # The big pipeline's own query buffer counted towards the limit and is
    # freed now: top up with single writes until one small write is refused.
    while True:
        written += 1
        try:
            client.set(f"filler:{written}", "x" * 200)
        except redis.exceptions.ResponseError as exc:
            assert "OOM" in str(exc) or "maxmemory" in str(exc)
            break
    # Memory still moves a little (the worker's connections' buffers shrink and
    # grow): with the limit just below what is held, no growing write can land.
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 100_000)
    return written


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "basic"])
def test_a_failure_at_maxmemory_is_recorded_or_waits_never_lost(
        full_redis: RedisServer, define: Define, launch_with: Callable[..., Launcher],
        reliable: bool) -> None:
    """With reliable fetch the settle's removal is the script's first write, and
    Redis (7.0 here) lets a script that has written go on writing at
    maxmemory: the retry entry lands at once. Basic fetch has nothing to
    remove, so the write is refused; it is retried with backoff until memory
    frees, and the job is neither lost nor run again meanwhile."""
    config = Config(redis_url=full_redis.url, heartbeat_interval=30.0,
                    poll_interval_average=30.0, fetch_timeout=0.2, concurrency=1,
                    reliable_fetch=reliable, redis_retry_base=0.05, redis_retry_cap=0.2,
                    log_level="warning")
    client = redis.Redis(host="127.0.0.1", port=full_redis.port)
    # Held until the test lets it go: filling Redis takes seconds on a loaded
    # machine, and a job that failed before Redis was full would record its
    # retry at once (the Gate's default hold is 5 s).
    gate = Gate(hold=60)
    runs: list[str] = []

    def fail(tag: str) -> None:
        runs.append(tag)
        gate.run(tag)
        raise Boom("at maxmemory")

    job = define(fail)
    raw = payload(job.name, "full")
    client.lpush("queue:default", raw)
    launcher = launch_with(config)
    try:
        assert gate.started.wait(30)
        fill(client)
        with capture_logs() as logs:
            gate.release.set()
            if reliable:
                wait_for(lambda: client.zcard(keys.RETRY) == 1, timeout=20)
            else:
                assert gate.finished.wait(30)
                t0 = time.monotonic()
                with contextlib.suppress(AssertionError):  # the old code gave up at once
                    wait_for(lambda: sum(settle_attempts(logs).values()) >= 3, timeout=10)
                assert client.zcard(keys.RETRY) == 0
                client.config_set("maxmemory", "8mb")
                client.delete(*[f"filler:{n}" for n in range(2000)])
                wait_for(lambda: client.zcard(keys.RETRY) == 1, timeout=20)
                full = time.monotonic() - t0
                attempts = sum(settle_attempts(logs).values())
                # Refused, and retried with backoff (at least 0.05 s apart), not a spin.
                assert 3 <= attempts <= 2 + full / 0.05
        (member,) = client.zrange(keys.RETRY, 0, -1)
        assert json.loads(member)["error_message"] == "at maxmemory"
        assert runs == ["full"]
        assert client.llen("queue:default") == 0
        assert not client.exists(wip(launcher.identity, "default"))
    finally:
        client.flushall()
        client.close()
        launcher.stop()
    close_runtime(config)


# -- item 3: nothing a job raises, or a payload holds, ends a processor thread --------------


class Alarm(BaseException):
    """A BaseException of the job's own."""


def test_base_exceptions_and_deep_payloads_do_not_stop_the_processors(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    """Issue #11 item 3: two such jobs and two such payloads at concurrency 2,
    then 50 good jobs: 0 of 50 ran, while the process looked alive."""
    config = tuned(config, concurrency=2)
    bad: dict[str, BaseException] = {"exit": SystemExit(3), "interrupt": KeyboardInterrupt(),
                                     "generator": GeneratorExit(), "alarm": Alarm("ring")}
    done: list[int] = []

    def raising(kind: str) -> None:
        raise bad[kind]

    raiser = define(raising)
    good = define(done.append)
    deep = ["[" * 100_000, '{"class": "X", "args": ' + "[" * 5_000 + "]" * 5_000 + "}"]
    for kind in bad:
        raiser.perform_async(kind)
    rb.lpush("queue:default", *deep)
    for n in range(50):
        good.perform_async(n)
    launcher = launch()
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(done) == 50, timeout=10)
    assert sorted(done) == list(range(50)), f"{len(done)} of 50 good jobs ran"
    retried = {json.loads(m)["error_class"] for m in r.zrange(keys.RETRY, 0, -1)}
    assert retried == {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "Alarm"}
    assert sorted(r.zrange(keys.DEAD, 0, -1)) == sorted(deep)
    assert all(t.is_alive() for t in launcher.manager._threads)
    launcher.stop()


class Unreadable(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


def raise_exit(exc: BaseException, context: Any) -> None:
    raise SystemExit("error handler")


def raise_interrupt(job: Any, exc: BaseException) -> None:
    raise KeyboardInterrupt


def deeply_nested(depth: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested]
    return nested


def poison(job: dict[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
    """Leaves in some payloads a value that cannot be written back as JSON."""
    if job["args"] == ["poisoned"]:
        job["extra"] = object()
    if job["args"] == ["deep"]:
        job["extra"] = deeply_nested(100_000)  # json.dumps raises RecursionError
    return call_next()


def test_hooks_and_messages_that_raise_do_not_stop_the_processors(
        r: redis.Redis, config: Config, define: Define, launch: Launch) -> None:
    """Siblings: an error handler or death handler raising a BaseException, an
    exception whose message cannot be read, a middleware that leaves in the
    payload a value JSON cannot carry or one nested too deep to serialise."""
    config = tuned(config, concurrency=1)
    config.error_handlers.append(raise_exit)
    config.death_handlers.append(raise_interrupt)
    config.server_middleware.append(poison)
    done: list[str] = []

    def work(tag: str) -> None:
        if tag == "ok":
            done.append(tag)
            return
        raise Unreadable

    job = define(work, retry=0)
    for tag in ("unreadable", "poisoned", "deep", "ok"):
        job.perform_async(tag)
    launcher = launch()
    wait_for(lambda: done == ["ok"], timeout=5)
    wait_for(lambda: r.zcard(keys.DEAD) == 3)
    entries = [json.loads(m) for m in r.zrange(keys.DEAD, 0, -1)]
    by_tag = {entry["args"][0]: entry for entry in entries}
    assert by_tag["unreadable"]["error_message"] == "!!! ERROR MESSAGE THREW AN ERROR !!!"
    # These could not be written back as stamped: they went to dead as fetched.
    assert "error_class" not in by_tag["poisoned"]
    assert "error_class" not in by_tag["deep"]
    assert all(t.is_alive() for t in launcher.manager._threads)
    launcher.stop()


def test_a_basic_fetch_failure_is_recorded_without_an_acknowledgement(
        r: redis.Redis, config: Config, define: Define, launch: Launch) -> None:
    config = tuned(config, reliable_fetch=False, concurrency=1)

    def fail() -> None:
        raise Boom("basic")

    job = define(fail)
    job.perform_async()
    launcher = launch()
    wait_for(lambda: r.zcard(keys.RETRY) == 1)
    launcher.stop()
    (member,) = r.zrange(keys.RETRY, 0, -1)
    assert json.loads(member)["error_message"] == "basic"

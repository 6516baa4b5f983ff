"""Testing mode (``wurk.testing``): fake and inline, with no Redis server at all.

Every test here runs with the default config pointing at a port where a
plain TCP socket listens and nothing speaks Redis (:func:`no_redis`): after
the test, that socket must have seen no connection attempt, and the spool
directory must be empty, so nothing pushed in testing mode went anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from no_redis import listening, untouched

import wurk
import wurk.testing
from wurk.push.client import Client
from wurk.push.periodic import make_entry
from wurk.push.periodic import table as periodic_table
from wurk.redis.runtime import close_runtime
from wurk.results.client import apeek
from wurk.settings.config import Config, default_config
from wurk.testing import mode as testing_mode

Define = Callable[..., wurk.JobFunction[..., Any]]


@pytest.fixture(autouse=True)
def no_redis(tmp_path: Path) -> Iterator[Config]:
    """The default config on a listening socket no Redis answers, with a spool of its
    own; afterwards: no connection was attempted and nothing was spooled."""
    spool = tmp_path / "spool"
    before = default_config()
    with listening() as (url, listener):
        config = wurk.configure(Config(redis_url=url, reliable_push=True,
                                       spool_dir=str(spool), redis_connect_timeout=0.5))
        Client._default = None
        try:
            yield config
            assert untouched(listener)
            assert not spool.exists() or list(spool.iterdir()) == []
        finally:
            wurk.configure(before)
            Client._default = None


def test_a_fake_collects_pushes_in_order_with_views_per_queue_and_per_job(
        define: Define) -> None:
    def send(to: str) -> None: ...
    def log(line: str) -> None: ...
    sender, logger = define(send, queue="mail"), define(log)
    with wurk.testing.fake() as fake:
        first = sender.perform_async("a@example.com")
        logger.perform_async("hello")
        later = sender.perform_in(60, "b@example.com")
        sender.set(queue="urgent").perform_async("c@example.com")
        assert [job.args for job in fake.jobs] == [["a@example.com"], ["hello"],
                                                   ["b@example.com"], ["c@example.com"]]
        assert [job.jid for job in fake.jobs_in("mail")] == [first, later]
        assert [job.queue for job in fake.jobs_of(sender)] == ["mail", "mail", "urgent"]
        assert fake.jobs_of(logger.name) == fake.jobs_in("default")
        assert fake.jobs[0].at is None and fake.jobs[2].at is not None
        # The payload is the one a real push writes, from the text it writes.
        payload = fake.jobs[0].payload
        assert payload["class"] == sender.name and payload["retry"] is True
        assert {"jid", "created_at", "enqueued_at"} <= set(payload)
        assert json.loads(fake.jobs[0].raw) == payload


def test_a_push_a_real_client_refuses_fails_the_same_way_in_fake_mode(define: Define) -> None:
    def two(a: int, b: int) -> None: ...
    job = define(two)
    with wurk.testing.fake() as fake:
        with pytest.raises(wurk.ArgumentError):
            job.perform_async(1, object())
        with pytest.raises(TypeError):
            job.perform_async(1)
        assert fake.jobs == []


def test_drain_runs_the_jobs_and_what_they_push_through_the_server_middleware(
        define: Define, no_redis: Config) -> None:
    seen: list[tuple[str, str]] = []

    def recording(payload: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        seen.append((str(payload["class"]), queue))
        return call_next()

    done: list[int] = []

    def leaf(n: int) -> None:
        done.append(n)

    leaves = define(leaf, queue="leaves")

    def root(n: int) -> None:
        leaves.perform_bulk([[n], [n + 1]])

    roots = define(root)
    wurk.configure(Config(redis_url=no_redis.redis_url, spool_dir=no_redis.spool_dir,
                          server_middleware=[recording]))
    with wurk.testing.fake() as fake:
        roots.perform_async(10)
        assert fake.drain() == 3
        assert done == [10, 11] and fake.jobs == []
        assert seen == [(roots.name, "default"), (leaves.name, "leaves"),
                        (leaves.name, "leaves")]


def test_drain_runs_only_the_queue_it_is_given(define: Define) -> None:
    ran: list[str] = []

    def note(word: str) -> None:
        ran.append(word)

    job = define(note)
    with wurk.testing.fake() as fake:
        job.set(queue="a").perform_async("first")
        job.set(queue="b").perform_async("second")
        assert fake.drain("b") == 1
        assert ran == ["second"] and [j.args for j in fake.jobs] == [["first"]]


def test_a_job_that_fails_twice_then_succeeds_drains_through_its_retries(
        define: Define, no_redis: Config) -> None:
    counts: list[Any] = []

    def counting(payload: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        counts.append(payload.get("retry_count"))
        return call_next()

    def flaky() -> str:
        if len(counts) < 3:
            raise ConnectionError("the mail server is away")
        return "sent"

    job = define(flaky, retry=5)
    wurk.configure(Config(redis_url=no_redis.redis_url, spool_dir=no_redis.spool_dir,
                          server_middleware=[counting]))
    with wurk.testing.fake() as fake:
        job.perform_async()
        assert fake.drain() == 3
        # The retry handler's own bookkeeping: a first failure, then retry 1.
        assert counts == [None, 0, 1]
        assert fake.retries == [] and fake.dead == []


def test_a_job_that_always_fails_ends_in_dead_and_drain_raises_its_exception(
        define: Define) -> None:
    runs: list[int] = []

    def broken(n: int) -> None:
        runs.append(n)
        raise KeyError(f"no user {n}")

    job = define(broken, retry=2)
    with wurk.testing.fake() as fake:
        jid = job.perform_async(7)
        with pytest.raises(KeyError, match="no user 7"):
            fake.drain()
        assert runs == [7, 7, 7]  # the first run and its two retries
        [dead] = fake.dead
        assert dead.jid == jid and isinstance(dead.error, KeyError)
        assert dead.payload["error_class"] == "KeyError" and dead.payload["retry_count"] == 2
        fake.clear()
        job.perform_async(8)
        assert fake.drain(raise_failures=False) == 3
        assert [one.args for one in fake.dead] == [[8]]


def test_a_job_with_retry_false_is_dropped_and_drain_raises(define: Define) -> None:
    def once() -> None:
        raise ValueError("no")

    job = define(once, retry=False)
    with wurk.testing.fake() as fake:
        job.perform_async()
        with pytest.raises(ValueError, match="no"):
            fake.drain()
        assert fake.dead == [] and fake.retries == [] and fake.jobs == []


def test_clear_forgets_everything(define: Define) -> None:
    def nothing() -> None: ...
    job = define(nothing, unique_for=60)
    with wurk.testing.fake() as fake:
        job.perform_async()
        assert fake.locks
        fake.clear()
        assert fake.jobs == [] and fake.locks == {}
        assert job.perform_async() is not None


def test_the_client_middleware_runs_on_a_fake_push(define: Define, no_redis: Config) -> None:
    def stopping(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], None]) -> None:
        payload["tenant"] = "acme"
        if payload["args"] != ["skip"]:
            call_next()

    def job_fn(word: str) -> None: ...
    job = define(job_fn)
    wurk.configure(Config(redis_url=no_redis.redis_url, spool_dir=no_redis.spool_dir,
                          client_middleware=[stopping]))
    with wurk.testing.fake() as fake:
        assert job.perform_async("skip") is None
        assert job.perform_async("keep") is not None
        [kept] = fake.jobs
        assert kept.payload["tenant"] == "acme"


def test_a_unique_job_is_refused_while_its_lock_is_held_and_freed_by_its_success(
        define: Define) -> None:
    def sync(account: int) -> None: ...
    job = define(sync, unique_for=3600)
    with wurk.testing.fake() as fake:
        assert job.perform_async(1) is not None
        assert job.perform_async(1) is None
        assert job.perform_async(2) is not None
        assert len(fake.locks) == 2
        fake.drain()
        assert fake.locks == {}
        assert job.perform_async(1) is not None


def test_a_unique_lock_until_start_is_freed_as_the_job_starts(define: Define) -> None:
    seen: list[bool] = []

    def check() -> None:
        seen.append(wurk.testing.current().locks == {})

    job = define(check, unique_for=3600, unique_until="start")
    with wurk.testing.fake() as fake:
        job.perform_async()
        fake.drain()
    assert seen == [True]


def test_results_are_kept_in_memory(define: Define) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    def fails() -> None:
        raise RuntimeError("boom")

    adder, failing = define(add, store_result=True), define(fails, store_result=True, retry=0)
    with wurk.testing.fake() as fake:
        jid = adder.perform_async(2, 3)
        bad = failing.perform_async()
        with pytest.raises(wurk.ResultTimeout):
            fake.result(jid)
        with pytest.raises(wurk.ResultTimeout):
            wurk.result(jid, timeout=30)  # at once: nothing runs while a test waits
        fake.drain(raise_failures=False)
        assert fake.result(jid) == 5 and wurk.result(jid) == 5
        with pytest.raises(wurk.JobFailed, match="boom"):
            wurk.result(bad)
        assert set(fake.results) == {jid, bad}


def test_a_result_is_there_as_soon_as_an_inline_push_returns(define: Define) -> None:
    def square(n: int) -> int:
        return n * n

    job = define(square, store_result=True)
    with wurk.testing.inline():
        assert wurk.result(job.perform_async(7)) == 49


def test_aresult_reads_the_modes_results_and_never_waits(define: Define) -> None:
    def double(n: int) -> int:
        return 2 * n

    job = define(double, store_result=True)
    with wurk.testing.fake() as fake:
        jid = job.perform_async(4)

        async def before_and_after() -> tuple[bool, Any, Any]:
            try:
                await wurk.aresult(jid, timeout=30)  # at once: nothing runs while it waits
                early = False
            except wurk.ResultTimeout:
                early = True
            fake.drain()
            peeked = await apeek(jid)
            return early, await wurk.aresult(jid), peeked.value if peeked else None

        assert asyncio.run(before_and_after()) == (True, 8, 8)


def test_run_due_pushes_each_due_periodic_entry_once_per_tick(define: Define) -> None:
    def report() -> None: ...
    job = define(report, queue="reports")
    entries = [make_entry("0 9 * * *", job, args=["daily"])]
    nine = 1_767_258_000  # 2026-01-01 09:00:00 UTC
    with wurk.testing.fake() as fake:
        assert fake.run_due(nine - 1, entries) == []
        [jid] = fake.run_due(nine + 30, entries)
        assert fake.run_due(nine + 45, entries) == []  # that tick was pushed already
        [pushed] = fake.jobs
        assert pushed.jid == jid and pushed.queue == "reports"
        assert pushed.payload["periodic"] == {"name": job.name, "tick": nine}


def test_the_async_verbs_and_async_jobs_work_in_fake_mode(define: Define) -> None:
    done: list[int] = []

    async def fetch(n: int) -> None:
        await asyncio.sleep(0)
        done.append(n)

    job = define(fetch)
    with wurk.testing.fake() as fake:
        jid = asyncio.run(job.aperform_async(4))
        assert [one.jid for one in fake.jobs] == [jid]
        fake.drain()
    assert done == [4]


def test_inline_runs_each_push_at_once_after_a_json_round_trip(define: Define) -> None:
    got: list[Any] = []

    def keep(value: Any) -> None:
        got.append(value)

    job = define(keep)
    order = {"items": [1, 2], "note": None}
    with wurk.testing.inline():
        assert job.perform_async(order) is not None
        # Run at once, with what JSON gave back: equal, never the caller's object.
        assert got == [order] and got[0] is not order and got[0]["items"] is not order["items"]
        for refused in ((1, 2), datetime.now(UTC), {1: "an int key"}):
            with pytest.raises(wurk.ArgumentError):
                job.perform_async(refused)
        assert len(got) == 1


def test_inline_raises_the_jobs_own_exception_to_the_pusher_without_a_retry(
        define: Define) -> None:
    runs: list[str] = []

    def fragile(word: str) -> None:
        runs.append(word)
        raise LookupError(word)

    job = define(fragile, unique_for=3600)
    with wurk.testing.inline() as mode:
        with pytest.raises(LookupError, match="first"):
            job.perform_async("first")
        assert mode.box.retries == [] and mode.locks == {}
        with pytest.raises(LookupError):
            job.perform_async("first")  # not refused as a duplicate: the job is gone
    assert runs == ["first", "first"]


def test_inline_runs_what_a_job_pushes_inside_it(define: Define) -> None:
    order: list[str] = []

    def child() -> None:
        order.append("child")

    children = define(child)

    def parent() -> None:
        order.append("parent")
        children.perform_async()
        order.append("parent done")

    parents = define(parent)
    with wurk.testing.inline():
        parents.perform_async()
    assert order == ["parent", "child", "parent done"]


def test_both_modes_work_as_decorators_and_nest(define: Define) -> None:
    def noop() -> None: ...
    job = define(noop)

    @wurk.testing.fake()
    def pushes_two() -> int:
        job.perform_async()
        job.perform_async()
        return len(wurk.testing.current().jobs)  # type: ignore[attr-defined]

    assert pushes_two() == 2
    assert pushes_two() == 2  # each call starts empty
    with wurk.testing.fake() as outer:
        with wurk.testing.inline():
            job.perform_async()
        assert outer.jobs == []
        job.perform_async()
        assert len(outer.jobs) == 1
    assert Client.stand_in is None and wurk.AsyncClient.stand_in is None
    with pytest.raises(wurk.testing.NoModeError):
        wurk.testing.current()


def test_what_fake_mode_does_not_fake_fails_loudly_without_connecting(define: Define) -> None:
    def member() -> None: ...
    job = define(member)
    for mode in (wurk.testing.fake, wurk.testing.inline):
        with mode(), pytest.raises(wurk.testing.NoRedisError), wurk.Batch("no") as batch:
            batch.add(job)
        with mode(), pytest.raises(wurk.testing.NoRedisError):
            wurk.Workflow(wurk.step(job) >> wurk.step(job)).start()


def _loaded_by(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.split()


def test_import_wurk_loads_neither_pytest_nor_the_testing_mode() -> None:
    loaded = _loaded_by("import wurk")
    assert [m for m in loaded if m.split(".")[0] in ("pytest", "_pytest")] == []
    assert [m for m in loaded if m.startswith("wurk.testing")] == []


def test_the_pytest_plugin_loads_no_more_than_import_wurk_until_a_fixture_is_used() -> None:
    plugin = set(_loaded_by("import wurk.testing.pytest_plugin"))
    assert {m for m in plugin - set(_loaded_by("import wurk, pytest"))
            if m.startswith("wurk")} == {"wurk.testing", "wurk.testing.pytest_plugin"}


def test_a_job_that_pushes_itself_forever_stops_the_drain(
        define: Define, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing_mode, "MAX_RUNS", 50)
    holder: list[wurk.JobFunction[..., Any]] = []

    def again() -> None:
        holder[0].perform_async()

    holder.append(define(again))
    with wurk.testing.fake() as fake:
        holder[0].perform_async()
        with pytest.raises(RuntimeError, match="pushes itself forever"):
            fake.drain()


def test_calling_a_job_classes_perform_directly_fills_in_its_run_attributes() -> None:
    class Greeter(wurk.Job, name=f"t_greeter_{os.getpid()}", queue="mail"):
        def perform(self, name: str) -> str:
            return f"{self.jid}:{self.payload['queue']}:{name}"

    try:
        job = Greeter()
        jid, queue, name = job.perform("ada").split(":")
        assert len(jid) == 24 and jid == job.jid and queue == "mail" and name == "ada"
        assert job.payload["class"] == Greeter.wurk_name and job.payload["jid"] == jid
        with pytest.raises(AttributeError, match="nothing_here"):
            _ = job.nothing_here  # type: ignore[attr-defined]
    finally:
        wurk.registry.discard(Greeter.wurk_name)


def test_the_fixtures_come_from_the_installed_plugin(wurk_fake: wurk.testing.Fake,
                                                     define: Define) -> None:
    def noop() -> None: ...
    job = define(noop)
    jid = job.perform_async()
    assert [one.jid for one in wurk_fake.jobs] == [jid]
    assert wurk_fake.drain() == 1


def test_the_inline_fixture(wurk_inline: wurk.testing.Inline, define: Define) -> None:
    ran: list[int] = []

    def add(n: int) -> None:
        ran.append(n)

    define(add).perform_async(1)
    assert ran == [1]


def test_the_probe_sees_a_real_push_try_to_connect(define: Define) -> None:
    # The check every test here ends with is not vacuous: outside testing
    # mode, the same push reaches for the socket at once.
    def real() -> None: ...
    job = define(real)
    with listening() as (url, listener):
        config = Config(redis_url=url, reliable_push=False, redis_read_timeout=0.2,
                        redis_connect_timeout=0.5, redis_retry_attempts=1)
        client = wurk.Client(config, drain_spool=False)
        try:
            with pytest.raises(Exception):  # noqa: B017 - whatever a mute server makes of it
                job.set(client=client).perform_async()
        finally:
            close_runtime(config)
        assert not untouched(listener)


def test_a_push_through_a_client_of_its_own_is_collected_too(define: Define,
                                                             no_redis: Config) -> None:
    def charge(order: str) -> None: ...
    job = define(charge)
    own = wurk.Client(no_redis, drain_spool=False)
    with wurk.testing.fake() as fake:
        jid = job.set(client=own, queue="critical").perform_async("o-1")
        assert [(one.jid, one.queue) for one in fake.jobs] == [(jid, "critical")]


def test_a_mode_follows_a_default_config_installed_while_it_is_on(
        define: Define, no_redis: Config) -> None:
    marks: list[str] = []

    def marking(payload: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        marks.append(str(payload["args"][0]))
        return call_next()

    def work(word: str) -> None: ...
    job = define(work)
    with wurk.testing.fake() as fake:
        # An app factory run inside the test installs its own config.
        wurk.configure(Config(redis_url=no_redis.redis_url, spool_dir=no_redis.spool_dir,
                              server_middleware=[marking]))
        job.perform_async("after")
        fake.drain()
    assert marks == ["after"]


def test_a_bulk_push_takes_each_unique_lock_in_memory(define: Define) -> None:
    def sync(account: int) -> None: ...
    job = define(sync, unique_for=60)
    with wurk.testing.fake() as fake:
        jids = job.perform_bulk([[1], [1], [2]])
        assert [one.jid for one in fake.jobs] == jids and len(jids) == 2
        assert [one.args for one in fake.jobs] == [[1], [2]]


def test_run_due_reads_the_declared_periodic_entries_and_skips_paused_ones(
        define: Define) -> None:
    def tick() -> None: ...
    job = define(tick)
    entries = [wurk.periodic("*/5 * * * *", job, name=f"{job.name}-on"),
               wurk.periodic("*/5 * * * *", job, name=f"{job.name}-off", paused=True)]
    try:
        with wurk.testing.fake() as fake:
            # Other entries this process declared may be due too: only ours are looked at.
            ran = fake.run_due(datetime(2026, 3, 1, 12, 5, 10, tzinfo=UTC))
            [pushed] = fake.jobs_of(job)
            assert pushed.jid in ran
            assert pushed.payload["periodic"]["name"] == f"{job.name}-on"
    finally:
        for entry in entries:
            periodic_table.discard(entry.name)


def test_a_result_json_cannot_carry_fails_as_it_would_on_a_worker(define: Define) -> None:
    def odd() -> set[int]:
        return {1, 2}

    job = define(odd, store_result=True)
    with wurk.testing.inline(), pytest.raises(wurk.JobFailed, match="a result must be JSON"):
        wurk.result(job.perform_async())

"""The job lifecycle: one skeleton, features as steps, their writes in one round trip.

Driven through a real manager's lifecycle and the threads executor's
processor against the test Redis: a step registered beside the built-in
ones is called in only by its trigger, its hooks run in the documented
order, and a job's settlement writes (result, batch count, unique release)
reach Redis in one round trip, sent again until they land.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.core.backoff import Backoff
from wurk.push.job import JobFunction, registry
from wurk.redis.runtime import runtime_for
from wurk.runtime.aio_processor import AsyncProcessor
from wurk.runtime.lifecycle import writes
from wurk.runtime.lifecycle.skeleton import Lifecycle
from wurk.runtime.lifecycle.step import Call, Ending, Run, Step
from wurk.runtime.lifecycle.writes import Write
from wurk.runtime.manager import Manager
from wurk.runtime.processor import Processor
from wurk.runtime.work import UnitOfWork
from wurk.settings.config import Config
from wurk.settings.queues import parse_queues
from wurk.wire.lua import Script

Define = Callable[..., JobFunction[..., Any]]
SET_ARG = Script("test_set", 'redis.call("set", KEYS[1], ARGV[1]) return 1')


class Recording(Step):
    """A step of the test's own, called in by the ``x_recorded`` field."""

    name = "recording"
    triggers = ("x_recorded",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def admit(self, run: Run) -> BaseException | None:
        self.seen.append("admit")
        return None

    def start(self, run: Run) -> None:
        self.seen.append("start")

    def enter(self, run: Run) -> None:
        self.seen.append("enter")

    def around(self, run: Run, call: Call) -> Call:
        def wrapped() -> Any:
            self.seen.append("around")
            return call()
        return wrapped

    def exit(self, run: Run) -> None:
        self.seen.append("exit")

    def observe(self, run: Run, elapsed: float, failed: bool) -> None:
        self.seen.append(f"observe:{failed}")

    def concluding(self, run: Run, ending: Ending) -> Sequence[Write]:
        self.seen.append(f"concluding:{ending.outcome}")
        return [Write(SET_ARG, [f"recorded:{run.jid}"], [ending.outcome],
                      refused=lambda exc, attempt: False)]

    def concluded(self, run: Run, ending: Ending) -> None:
        self.seen.append(f"concluded:{ending.outcome}")


@pytest.fixture
def manager(config: Config) -> Iterator[Manager]:
    # a job handed in by hand has no private list to leave
    config = tuned(config, reliable_fetch=False)
    built = Manager(config, parse_queues(["default"]), registry, "test-identity")
    yield built
    built.timer.stop()


def _run(manager: Manager, steps: list[Step], payload: dict[str, Any]) -> Lifecycle:
    lifecycle = Lifecycle(manager.config, manager.lifecycle.registry, manager.fetch,
                          manager.counters, manager.in_flight, retry=manager.retry,
                          steps=[*manager.lifecycle.steps, *steps])
    Processor(lifecycle).process(UnitOfWork("default", json.dumps(payload).encode()), "t1")
    return lifecycle


def _payload(job: JobFunction[..., Any], *args: Any, **fields: Any) -> dict[str, Any]:
    return {"class": job.name, "args": list(args), "queue": "default", "retry": 1,
            "jid": f"{time.monotonic_ns():024x}"[-24:], "created_at": time.time(), **fields}


def test_a_step_is_called_in_by_its_field_and_its_hooks_run_in_order(
        manager: Manager, define: Define, r: redis.Redis) -> None:
    job = define(lambda: None)
    step = Recording()
    _run(manager, [step], _payload(job))
    assert step.seen == []  # no trigger field: the step never met the job
    payload = _payload(job, x_recorded=True)
    _run(manager, [step], payload)
    assert step.seen == ["admit", "start", "enter", "around", "observe:False", "exit",
                         "concluding:success", "concluded:success"]
    assert r.get(f"recorded:{payload['jid']}") == "success"


def test_a_failing_job_concludes_as_the_retry_handler_says(
        manager: Manager, define: Define, r: redis.Redis) -> None:
    def fails() -> None:
        raise ValueError("no")

    step = Recording()
    payload = _payload(define(fails), x_recorded=True)
    _run(manager, [step], payload)
    assert step.seen == ["admit", "start", "enter", "around", "observe:True", "exit",
                         "concluding:retry", "concluded:retry"]
    assert r.get(f"recorded:{payload['jid']}") == "retry"
    assert r.zcard("retry") == 1


def test_a_broken_step_loses_only_its_own_writes(
        manager: Manager, define: Define, r: redis.Redis) -> None:
    class Broken(Step):
        name = "broken"
        triggers = ("x_recorded",)

        def concluding(self, run: Run, ending: Ending) -> Sequence[Write]:
            raise RuntimeError("a bug in a step")

    ran: list[int] = []
    job = define(lambda: ran.append(1), store_result=True)
    payload = _payload(job, x_recorded=True, result_ttl=60)
    step = Recording()
    _run(manager, [Broken(), step], payload)
    assert ran == [1]
    assert r.get(f"recorded:{payload['jid']}") == "success"  # the other step's write landed
    assert wurk.result(payload["jid"], timeout=0) is None
    assert (manager.counters.processed, manager.counters.failed) == (1, 0)
    assert r.zcard("retry") == 0


def test_a_jobs_writes_go_in_one_round_trip(
        manager: Manager, define: Define, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[list[str]] = []
    real = writes.send

    def counted(pool: Any, found: Sequence[Write], *args: Any) -> bool:
        sent.append([w.script.name for w in found])
        return real(pool, found, *args)

    monkeypatch.setattr(writes, "send", counted)
    with wurk.Batch() as batch:
        jid = batch.add(define(lambda: "done", store_result=True, unique_for=600))
    [raw] = r.lrange("queue:default", 0, -1)
    assert r.keys("unique:*")  # the push took its lock
    _run(manager, [], json.loads(raw))
    assert sent == [["result_store", "batch_succeeded", "unique_release"]]
    assert wurk.result(jid, timeout=0) == "done"
    assert r.hget(f"b-{batch.bid}", "pending") == "0"
    assert not r.keys("unique:*")


def test_writes_land_in_one_round_trip_even_after_redis_lost_its_scripts(
        config: Config, r: redis.Redis) -> None:
    # one connection: its round trips are the pool's
    config = tuned(config, redis_pool_size=1)
    pool = runtime_for(config).pool
    landed: list[Any] = []
    batch = [Write(SET_ARG, [f"k{n}"], [n], refused=lambda exc, attempt: False,
                   landed=landed.append) for n in range(3)]
    r.script_flush()
    assert writes.send(pool, batch, lambda wait: False, Backoff(0.01, 0.01))
    assert [r.get(f"k{n}") for n in range(3)] == ["0", "1", "2"] and landed == [1, 1, 1]
    trips = pool.run(lambda conn: conn.round_trips)
    assert writes.send(pool, batch, lambda wait: False, Backoff(0.01, 0.01))
    assert pool.run(lambda conn: conn.round_trips) - trips == 1


def test_a_write_given_up_does_not_hold_the_others_and_a_stop_ends_the_wait(
        config: Config, r: redis.Redis) -> None:
    pool = runtime_for(config).pool
    r.set("typed", "x")
    wrong = Script("test_wrong", 'return redis.call("lpush", KEYS[1], "v")')
    refusals: list[int] = []

    def retry_twice(exc: Exception, attempt: int) -> bool:
        refusals.append(attempt)
        return attempt < 2

    found = [Write(wrong, ["typed"], [], refused=retry_twice),
             Write(SET_ARG, ["fine"], ["1"], refused=lambda exc, attempt: False)]
    assert writes.send(pool, found, lambda wait: False, Backoff(0.01, 0.01))
    assert refusals == [1, 2] and r.get("fine") == "1"
    stops: list[float] = []
    forever = [Write(wrong, ["typed"], [], refused=lambda exc, attempt: True)]
    assert not writes.send(pool, forever, lambda wait: stops.append(wait) or len(stops) == 3,
                           Backoff(0.01, 0.01))
    assert len(stops) == 3


def test_a_job_parked_in_dead_ends_as_dead_for_its_steps_too(
        config: Config, define: Define, r: redis.Redis,
        launch_with: Callable[..., Any]) -> None:
    """Its retry entry cannot be written (a middleware left a lone surrogate),
    so the settle parks it in dead: its log line, its batch, its result and
    its lock say dead, not the retry that was planned."""
    def spoil(job: dict[str, Any], queue: str, call: Callable[[], Any]) -> Any:
        job["note"] = "\udcff"
        raise RuntimeError("failed, and left something unwritable behind")

    config = tuned(config, server_middleware=[spoil])
    wurk.configure(config)
    with wurk.Batch() as batch:
        jid = batch.add(define(lambda: None, store_result=True, unique_for=600, retry=5))
    assert r.keys("unique:*")
    with capture_logs() as logs:
        launch_with(config)
        wait_for(lambda: r.zcard("dead") == 1, timeout=20, what="the job parked in dead")
        wait_for(lambda: not r.keys("unique:*"), timeout=20, what="its lock released")
    assert r.zcard("retry") == 0
    assert [e["event"] for e in logs if e.get("jid") == jid and e["event"] in (
        "job.retry", "job.dead")] == ["job.dead"]
    assert r.sismember(f"b-{batch.bid}-died", jid)
    with pytest.raises(wurk.JobFailed):
        wurk.result(jid, timeout=5)


class _ScriptedPool:
    """Injected faults: each write's reply per attempt, as the test draws them."""

    def __init__(self, plans: dict[int, list[bool]]) -> None:
        self.plans = plans  # write index -> refused on attempt n?
        self.sent: list[list[int]] = []

    def run(self, block: Callable[[Any], Any], *, idempotent: bool = False) -> Any:
        return block(self)

    def pipeline(self, commands: list[tuple[Any, ...]], **_: Any) -> list[Any]:
        indexes = [int(command[-1]) for command in commands]
        self.sent.append(indexes)
        attempt = len(self.sent) - 1
        return [redis.exceptions.ConnectionError("injected")
                if attempt < len(self.plans[i]) and self.plans[i][attempt] else 1
                for i in indexes]


@given(st.lists(st.lists(st.booleans(), max_size=6), min_size=1, max_size=5),
       st.integers(0, 8), st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_every_write_lands_once_or_is_given_up_or_the_stop_wins(
        plans: list[list[bool]], give_up_after: int, stop_after: int) -> None:
    pool = _ScriptedPool(dict(enumerate(plans)))
    refusals: dict[int, list[int]] = {i: [] for i in range(len(plans))}
    landed: list[int] = []
    landed_at: dict[int, int] = {}

    def write(i: int) -> Write:
        def refused(exc: Exception, attempt: int) -> bool:
            refusals[i].append(attempt)
            return attempt < give_up_after
        return Write(SET_ARG, ["k"], [i], refused=refused,
                     landed=lambda _: (landed.append(i), landed_at.update({i: len(pool.sent)})))

    waits: list[float] = []
    done = writes.send(pool, [write(i) for i in range(len(plans))],  # type: ignore[arg-type]
                       lambda wait: waits.append(wait) or len(waits) >= stop_after,
                       Backoff(0.0, 0.0))
    assert all(wait >= writes.SHORTEST_WAIT for wait in waits)  # never a spin
    assert len(landed) == len(set(landed))  # nothing lands twice
    for i, tries in refusals.items():
        assert tries == list(range(1, len(tries) + 1))  # attempts counted one by one
        if i in landed:
            assert len(tries) < give_up_after or not tries  # landed before it was given up
    given_up = [i for i, tries in refusals.items() if tries and tries[-1] >= give_up_after]
    if done:
        assert sorted(landed + given_up) == list(range(len(plans)))
    else:
        assert len(waits) == stop_after
    for i, round_trip in landed_at.items():  # what landed is never sent again
        assert all(i not in later for later in pool.sent[round_trip:])


def test_a_success_a_hard_stop_took_back_keeps_its_lock_for_its_next_run(
        manager: Manager, define: Define, r: redis.Redis) -> None:
    def body() -> None:
        manager.in_flight.abandon_all()  # a hard stop takes it back while it runs

    job = define(body, unique_for=600)
    job.perform_async()
    [raw] = r.lrange("queue:default", 0, -1)
    r.delete("queue:default")
    manager.processor.process(UnitOfWork("default", raw), "t1")
    assert r.keys("unique:*")  # held for the copy the stop handed back


def test_a_job_handed_back_by_a_stop_is_requeued_off_the_event_loop(
        manager: Manager, define: Define, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        return None

    payload = _payload(define(body))
    where: list[str] = []

    def requeue(works: Any) -> int:
        where.append(threading.current_thread().name)
        return 1

    async def hand_in() -> Any:
        tasks = AsyncProcessor(manager.lifecycle, manager.processor)
        manager.in_flight.abandon_all()
        try:
            return await tasks.process_async(UnitOfWork("default", json.dumps(payload).encode()),
                                             "s1")
        finally:
            tasks.stop_pools()

    monkeypatch.setattr(manager.fetch, "requeue", requeue)
    settle = asyncio.run(hand_in())
    assert where == []  # nothing of Redis on the loop
    assert settle is not None
    settle()  # what the manager runs on a bookkeeping thread
    assert len(where) == 1

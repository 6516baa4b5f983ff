"""The replay both pools drive: its verdicts as a table, and the two drivers alike.

``Replay.judge`` says, after a failed attempt of a block, whether to drop the
connection, what the error hook is told and how long to wait before the
replay (or to give up); ``Replay.starved`` the same for a starved checkout.
Those are checked here without Redis or sleeping. Then the same fault
scripts run through ``RedisPool.run`` and ``AsyncRedisPool.run`` must give
the same reports, pauses, disruptions and outcome: the pools differ only in
their I/O. (The sync pool's own cases are in test_redis_pool_run.py.)
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import pytest
import redis.exceptions as rx
from recording import Recorder

from wurk.redis.apool import AsyncConn, AsyncRedisPool
from wurk.redis.connection import Conn
from wurk.redis.policy import ConnectError, PoolExhausted
from wurk.redis.pool import RedisPool
from wurk.redis.replay import Replay, RetrySettings, Verdict

# Nothing listens here; a connection never dials unless a block sends something.
NOWHERE = "redis://127.0.0.1:1/0"
RETRY = RetrySettings(max_attempts=4, base=0.5, cap=4.0, checkout_timeout=0.2)


def read_only() -> rx.ResponseError:
    return rx.ResponseError("READONLY You can't write against a read only replica.")


def backoff(attempts: int, seed: int = 0) -> list[float]:
    """The pauses RETRY gives after failed attempts 1..attempts, drawn from Random(seed)."""
    rng = random.Random(seed)
    return [min(4.0, 0.5 * 2 ** (n - 1)) * (1 + rng.random() * 0.5)
            for n in range(1, attempts + 1)]


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def replay(rec: Recorder) -> Replay:
    return Replay(RETRY, rec, random.Random(0))


@pytest.mark.parametrize(("error", "attempt", "idempotent", "dirty", "verdict"), [
    # Nothing was sent: replayed, idempotent or not, after the backoff.
    (ConnectError("refused"), 1, False, False, Verdict(True, "retry", backoff(1)[0])),
    (ConnectError("refused"), 4, False, False, Verdict(True, "exhausted", None)),
    # Sent, outcome unknown: only an idempotent block is replayed.
    (rx.ConnectionError("closed"), 1, False, False, Verdict(True, "unsafe", None)),
    (rx.TimeoutError("read"), 1, True, True, Verdict(True, "retry", backoff(1)[0])),
    # A round trip of the block completed: a dial failure no longer proves it unapplied.
    (ConnectError("refused"), 2, False, True, Verdict(True, "unsafe", None)),
    # A failover refusal: one immediate retry on a fresh connection.
    (read_only(), 1, False, False, Verdict(True, "retry", 0.0)),
    (read_only(), 2, False, False, Verdict(True, "exhausted", None)),
    # Not Redis trouble: raised untouched, the connection kept, nothing reported.
    (rx.ResponseError("ERR wrong number of arguments"), 1, True, False,
     Verdict(False, None, None)),
    (ValueError("a bug"), 1, True, False, Verdict(False, None, None)),
])
def test_each_failure_gets_its_verdict(replay: Replay, error: Exception, attempt: int,
                                       idempotent: bool, dirty: bool, verdict: Verdict) -> None:
    got = replay.judge(error, attempt, RETRY.max_attempts, idempotent=idempotent, dirty=dirty)
    assert got.redial is verdict.redial and got.action == verdict.action
    assert got.pause == pytest.approx(verdict.pause)
    assert replay.disruptions == (1 if verdict.redial else 0)


def test_a_report_tells_the_hook_only_about_redis_trouble(replay: Replay, rec: Recorder) -> None:
    trouble, bug = ConnectError("refused"), ValueError("a bug")
    replay.report(trouble, 3, Verdict(True, "retry", 1.0))
    replay.report(bug, 1, Verdict(False, None, None))
    assert rec.calls == [(trouble, 3, "retry")]


def test_no_replay_is_planned_past_the_deadline(replay: Replay) -> None:
    with replay.deadline.bounded(time.monotonic() + 0.2):  # shorter than any 0.5 s+ backoff
        verdict = replay.judge(ConnectError("refused"), 1, 4, idempotent=False, dirty=False)
    assert verdict == Verdict(True, "deadline", None)
    with replay.deadline.bounded(time.monotonic() - 1):  # passed: not even an immediate retry
        verdict = replay.judge(read_only(), 1, 4, idempotent=False, dirty=False)
    assert verdict == Verdict(True, "deadline", None)
    assert replay.checkout_timeout() == RETRY.checkout_timeout  # the bound is gone again


def test_a_starved_checkout_is_reported_and_paused_until_its_last_try(
        replay: Replay, rec: Recorder) -> None:
    starved = PoolExhausted("no connection free")
    pause = replay.starved(starved, 1, tries=2)
    assert pause is not None and 0.05 <= pause <= 0.1
    assert replay.starved(starved, 2, tries=2) is None
    assert replay.starved(starved, 1, tries=1) is None
    assert rec.actions == [("retry", 1), ("give_up", 2), ("give_up", 1)]
    assert replay.disruptions == 0  # no connection was dropped


def test_only_redis_trouble_counts_as_a_disruption(replay: Replay) -> None:
    replay.note_failure(ValueError("a bug"))
    replay.note_failure(rx.ResponseError("ERR syntax"))
    assert replay.disruptions == 0
    replay.note_failure(rx.ConnectionError("closed"))
    replay.note_failure(read_only())
    assert replay.disruptions == 2


# -- both drivers alike --------------------------------------------------------

class Script:
    """A fake block: run ``n`` bumps the connection's round trips by steps[n][1],
    then raises or returns steps[n][0]."""

    def __init__(self, *steps: tuple[object, int]) -> None:
        self.steps, self.runs = list(steps), 0

    def step(self, conn: Conn | AsyncConn) -> object:
        outcome, trips = self.steps[min(self.runs, len(self.steps) - 1)]
        self.runs += 1
        conn.round_trips += trips
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def run_sync(script: Script, idempotent: bool) -> dict[str, Any]:
    rec, sleeps = Recorder(), []
    pool = RedisPool(NOWHERE, retry=RETRY, on_error=rec, sleep=sleeps.append,
                     rng=random.Random(0))
    try:
        result: object = pool.run(script.step, idempotent=idempotent)
    except Exception as exc:  # noqa: BLE001 - compared below
        result = type(exc)
    pool.close()
    return {"result": result, "reports": rec.actions, "runs": script.runs,
            "pauses": [s for s in sleeps if s], "disruptions": pool.disruptions}


def run_async(script: Script, idempotent: bool) -> dict[str, Any]:
    rec, sleeps = Recorder(), []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def block(conn: AsyncConn) -> object:
        return script.step(conn)

    async def main() -> tuple[object, int]:
        pool = AsyncRedisPool(NOWHERE, retry=RETRY, on_error=rec, sleep=sleep,
                              rng=random.Random(0))
        try:
            result: object = await pool.run(block, idempotent=idempotent)
        except Exception as exc:  # noqa: BLE001 - compared below
            result = type(exc)
        await pool.close()
        return result, pool.disruptions

    result, disruptions = asyncio.run(main())
    return {"result": result, "reports": rec.actions, "runs": script.runs,
            "pauses": [s for s in sleeps if s], "disruptions": disruptions}


SCRIPTS = {
    "dial failures, then done": (lambda: Script((ConnectError("refused"), 0),
                                                (ConnectError("refused"), 0), ("done", 1)), False),
    "dial failures to the end": (lambda: Script((ConnectError("refused"), 0)), False),
    "a lost reply, not idempotent": (lambda: Script((rx.ConnectionError("closed"), 0)), False),
    "a lost reply, idempotent": (lambda: Script((rx.TimeoutError("read"), 1), ("done", 1)), True),
    "dirty, then a dial failure": (lambda: Script((ConnectError("refused"), 1)), False),
    "a failover refusal twice": (lambda: Script((read_only(), 0)), False),
    "a failover refusal once": (lambda: Script((read_only(), 0), ("done", 1)), False),
    "an error reply": (lambda: Script((rx.ResponseError("ERR nope"), 1)), True),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_sync_and_the_asyncio_pool_replay_alike(name: str) -> None:
    make, idempotent = SCRIPTS[name]
    sync, async_ = run_sync(make(), idempotent), run_async(make(), idempotent)
    assert sync == async_
    if name == "dial failures to the end":  # the table is not empty: spot-check one row
        assert sync["reports"] == [("retry", 1), ("retry", 2), ("retry", 3), ("exhausted", 4)]
        assert sync["pauses"] == pytest.approx(backoff(3))
        assert sync["disruptions"] == 4 and sync["result"] is ConnectError


def test_forked_children_of_one_pool_draw_their_own_jitter() -> None:
    # A swarm forks its children after the parent made its pool: a seed the
    # parent drew would give every child the same replay pauses, in step.
    replay = Replay(RetrySettings(base=0.1, cap=10.0))
    pauses = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its first few pauses through a dial that failed
            os.close(read)
            drawn = [replay.judge(ConnectError("refused"), n, 10, idempotent=True,
                                  dirty=False).pause for n in range(1, 6)]
            os.write(write, repr(drawn).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            pauses.append(pipe.read())
        os.waitpid(pid, 0)
    assert pauses[0] != pauses[1]

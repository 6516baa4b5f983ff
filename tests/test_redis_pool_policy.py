"""Unit tests of the pool's apply-safety policy and of ``RedisPool.run`` with injected faults.

The pure functions are checked against hand-written tables; ``run`` is
driven by fake blocks that raise chosen exceptions (and bump
``conn.round_trips`` to simulate a completed round trip) with sleeps, jitter
and the error hook all injected, so nothing here waits or touches Redis,
except the fork tests, which need a real connection to inherit.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.exceptions as rx
from conftest import reap_probe_clients
from recording import Recorder

from wurk.redis.connection import Conn
from wurk.redis.policy import (
    ConnectError,
    ErrorKind,
    Plan,
    PoolExhausted,
    backoff_delay,
    classify,
    retry_plan,
)
from wurk.redis.pool import RedisPool, RetrySettings

if TYPE_CHECKING:
    from conftest import RedisServer

# Conn never dials unless a block sends something: nothing listens here.
NOWHERE = "redis://127.0.0.1:1/0"


class FixedRng(random.Random):
    """A Random whose ``random()`` always returns one value."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# -- classify -----------------------------------------------------------------

@pytest.mark.parametrize(("error", "kind"), [
    (ConnectError("cannot connect"), ErrorKind.CONNECT),
    (rx.ConnectionError("Connection closed by server."), ErrorKind.IO),
    (rx.TimeoutError("Timeout reading from socket"), ErrorKind.IO),
    (TimeoutError("timed out"), ErrorKind.IO),
    (ConnectionResetError(104, "reset"), ErrorKind.IO),
    (BrokenPipeError(32, "broken pipe"), ErrorKind.IO),
    (OSError("network is unreachable"), ErrorKind.IO),
    # LOADING is a refusal (nothing ran), not a lost reply: replayable like a failed dial.
    (rx.BusyLoadingError("Redis is loading the dataset in memory"), ErrorKind.CONNECT),
    (PoolExhausted("no Redis connection free"), ErrorKind.IO),
    (rx.ResponseError("READONLY You can't write against a read only replica."),
     ErrorKind.FAILOVER),
    # redis-py strips the code off the message of the class it maps READONLY to.
    (rx.ReadOnlyError("You can't write against a read only replica."), ErrorKind.FAILOVER),
    (rx.ResponseError("NOREPLICAS Not enough good replicas to write."), ErrorKind.FAILOVER),
    (rx.ResponseError("UNBLOCKED force unblock from blocking operation"), ErrorKind.FAILOVER),
    (rx.ResponseError("readonly lower case is not the server's code"), ErrorKind.OTHER),
    (rx.ResponseError("ERR READONLY only counts as a prefix"), ErrorKind.OTHER),
    (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
     ErrorKind.OTHER),
    (rx.ResponseError("ERR unknown command"), ErrorKind.OTHER),
    (rx.ExecAbortError("Transaction discarded because of previous errors."), ErrorKind.OTHER),
    (rx.NoScriptError("No matching script."), ErrorKind.OTHER),
    (rx.AuthenticationError("invalid username-password pair"), ErrorKind.OTHER),
    (rx.AuthorizationError("not allowed"), ErrorKind.OTHER),
    (rx.DataError("Invalid input of type: 'dict'"), ErrorKind.OTHER),
    (ValueError("a bug in the block"), ErrorKind.OTHER),
    (KeyError("job"), ErrorKind.OTHER),
])
def test_classify(error: BaseException, kind: ErrorKind) -> None:
    assert classify(error) is kind


# -- retry_plan ----------------------------------------------------------------

B, E, F, U, P = Plan.BACKOFF, Plan.EXHAUSTED, Plan.FAILOVER, Plan.UNSAFE, Plan.PROPAGATE

# (kind, idempotent, dirty) -> plan after attempt 1..5 failed, with max_attempts=4.
PLANS: dict[tuple[ErrorKind, bool, bool], tuple[Plan, ...]] = {
    # A dial failure sent nothing: replay unless an earlier round trip applied.
    (ErrorKind.CONNECT, False, False): (B, B, B, E, E),
    (ErrorKind.CONNECT, False, True): (U, U, U, U, U),
    (ErrorKind.CONNECT, True, False): (B, B, B, E, E),
    (ErrorKind.CONNECT, True, True): (B, B, B, E, E),
    # After sending, the outcome is unknown: only idempotent blocks replay.
    (ErrorKind.IO, False, False): (U, U, U, U, U),
    (ErrorKind.IO, False, True): (U, U, U, U, U),
    (ErrorKind.IO, True, False): (B, B, B, E, E),
    (ErrorKind.IO, True, True): (B, B, B, E, E),
    # A refusal applied nothing: one immediate retry, then give up (reported).
    (ErrorKind.FAILOVER, False, False): (F, E, E, E, E),
    (ErrorKind.FAILOVER, False, True): (U, U, U, U, U),
    (ErrorKind.FAILOVER, True, False): (F, E, E, E, E),
    (ErrorKind.FAILOVER, True, True): (F, E, E, E, E),
    # Real error replies and bugs are never ours to retry.
    (ErrorKind.OTHER, False, False): (P, P, P, P, P),
    (ErrorKind.OTHER, False, True): (P, P, P, P, P),
    (ErrorKind.OTHER, True, False): (P, P, P, P, P),
    (ErrorKind.OTHER, True, True): (P, P, P, P, P),
}

PLAN_CASES = [
    pytest.param(kind, idem, dirty, attempt, plans[attempt - 1],
                 id=f"{kind.value}-{'idem' if idem else 'once'}-"
                    f"{'dirty' if dirty else 'clean'}-attempt{attempt}")
    for (kind, idem, dirty), plans in PLANS.items()
    for attempt in range(1, 6)
]


def test_plan_table_covers_every_combination() -> None:
    assert set(PLANS) == {(k, i, d) for k in ErrorKind for i in (False, True)
                          for d in (False, True)}


@pytest.mark.parametrize(("kind", "idempotent", "dirty", "attempt", "plan"), PLAN_CASES)
def test_retry_plan(kind: ErrorKind, idempotent: bool, dirty: bool, attempt: int,
                    plan: Plan) -> None:
    assert retry_plan(kind, attempt, 4, idempotent=idempotent, dirty=dirty) is plan


@pytest.mark.parametrize(("kind", "plan"), [
    (ErrorKind.CONNECT, Plan.EXHAUSTED),
    (ErrorKind.IO, Plan.EXHAUSTED),
    (ErrorKind.FAILOVER, Plan.FAILOVER),  # the failover retry is its own budget
    (ErrorKind.OTHER, Plan.PROPAGATE),
])
def test_retry_plan_with_a_single_attempt(kind: ErrorKind, plan: Plan) -> None:
    assert retry_plan(kind, 1, 1, idempotent=True, dirty=False) is plan


# -- backoff_delay -------------------------------------------------------------

@pytest.mark.parametrize(("attempt", "delay"), [
    (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (6, 4.0), (30, 4.0),
])
def test_backoff_is_exponential_and_capped(attempt: int, delay: float) -> None:
    assert backoff_delay(attempt, 0.5, 4.0, FixedRng(0.0)) == pytest.approx(delay)
    # Jitter adds up to half the delay, never more, never less than nothing.
    assert backoff_delay(attempt, 0.5, 4.0, FixedRng(0.5)) == pytest.approx(delay * 1.25)
    assert backoff_delay(attempt, 0.5, 4.0, FixedRng(0.999999)) == pytest.approx(
        delay * 1.5, rel=1e-5)


def test_backoff_jitter_stays_within_bounds_and_varies() -> None:
    rng = random.Random(0)
    for attempt in range(1, 8):
        floor = min(2.0, 0.1 * 2 ** (attempt - 1))
        samples = [backoff_delay(attempt, 0.1, 2.0, rng) for _ in range(200)]
        assert all(floor <= s <= floor * 1.5 for s in samples)
        assert len(set(samples)) > 100  # jittered, so a fleet does not retry in step


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    first = [backoff_delay(a, 0.5, 4.0, random.Random(7)) for a in range(1, 5)]
    again = [backoff_delay(a, 0.5, 4.0, random.Random(7)) for a in range(1, 5)]
    assert first == again


# -- RedisPool.run with injected faults -----------------------------------------

class Script:
    """A fake block: each run takes the next step of the script.

    A step is ``(outcome, round_trips)``: bump ``conn.round_trips`` that many
    times (completed round trips), then raise ``outcome`` if it is an
    exception or return it.
    """

    def __init__(self, *steps: tuple[object, int]) -> None:
        self.steps = list(steps)
        self.runs = 0
        self.conns: list[Conn] = []

    def __call__(self, conn: Conn) -> object:
        outcome, trips = self.steps[min(self.runs, len(self.steps) - 1)]
        self.runs += 1
        self.conns.append(conn)
        conn.round_trips += trips
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make_pool(rec: Recorder, sleeps: list[float]) -> Iterator[Callable[..., RedisPool]]:
    pools: list[RedisPool] = []

    def make(**kwargs: Any) -> RedisPool:
        kwargs.setdefault("retry", RetrySettings(max_attempts=4, base=0.5, cap=4.0,
                                                 checkout_timeout=0.2))
        kwargs.setdefault("sleep", sleeps.append)
        kwargs.setdefault("rng", random.Random(0))
        pool = RedisPool(kwargs.pop("url", NOWHERE), on_error=rec, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def expected_backoff(attempts: int, base: float, cap: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    out = []
    for attempt in range(1, attempts + 1):
        delay = min(cap, base * 2 ** (attempt - 1))
        out.append(delay * (1 + rng.random() * 0.5))
    return out


def read_only() -> rx.ResponseError:
    return rx.ResponseError("READONLY You can't write against a read only replica.")


def no_replicas() -> rx.ResponseError:
    return rx.ResponseError("NOREPLICAS Not enough good replicas to write.")


def unblocked() -> rx.ResponseError:
    return rx.ResponseError("UNBLOCKED force unblock from blocking operation")


@pytest.mark.parametrize(("make_error", "idempotent"), [
    (lambda: ConnectError("refused"), False),
    (lambda: ConnectError("refused"), True),
    (lambda: rx.ConnectionError("Connection closed by server."), True),
    (lambda: rx.TimeoutError("Timeout reading from socket"), True),
    (lambda: TimeoutError("timed out"), True),
])
def test_replayable_failure_backs_off_then_exhausts(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float],
        make_error: Callable[[], BaseException], idempotent: bool) -> None:
    errors = [make_error() for _ in range(4)]
    block = Script(*((e, 0) for e in errors))
    with pytest.raises(type(errors[0])) as raised:
        make_pool().run(block, idempotent=idempotent)
    assert raised.value is errors[3]  # the last failure propagates, untouched
    assert block.runs == 4
    assert rec.actions == [("retry", 1), ("retry", 2), ("retry", 3), ("exhausted", 4)]
    assert [e for e, _, _ in rec.calls] == errors
    assert sleeps == pytest.approx(expected_backoff(3, 0.5, 4.0))
    for attempt, slept in enumerate(sleeps, start=1):
        floor = 0.5 * 2 ** (attempt - 1)
        assert floor <= slept <= floor * 1.5


@pytest.mark.parametrize("make_error", [
    lambda: rx.ConnectionError("Connection closed by server."),
    lambda: rx.TimeoutError("Timeout reading from socket"),
    lambda: TimeoutError("timed out"),
    lambda: ConnectionResetError(104, "Connection reset by peer"),
])
def test_io_failure_of_a_non_idempotent_block_is_never_replayed(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float],
        make_error: Callable[[], BaseException]) -> None:
    error = make_error()
    block = Script((error, 0), ("never", 0))
    with pytest.raises(type(error)) as raised:
        make_pool().run(block)
    assert raised.value is error
    assert block.runs == 1
    assert rec.actions == [("unsafe", 1)]
    assert rec.calls[0][0] is error
    assert sleeps == []


@pytest.mark.parametrize("make_error", [read_only, no_replicas, unblocked,
                                        lambda: rx.ReadOnlyError("You can't write")])
@pytest.mark.parametrize("idempotent", [False, True])
def test_failover_reply_retries_once_at_once_then_raises(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float],
        make_error: Callable[[], rx.ResponseError], idempotent: bool) -> None:
    first, second = make_error(), make_error()
    block = Script((first, 0), (second, 0), ("never", 0))
    with pytest.raises(rx.ResponseError) as raised:
        make_pool().run(block, idempotent=idempotent)
    assert raised.value is second
    assert block.runs == 2
    assert rec.actions == [("retry", 1), ("exhausted", 2)]
    assert sleeps == []  # a failover retry reconnects at once


@pytest.mark.parametrize("make_error", [read_only, no_replicas, unblocked])
def test_failover_reply_then_success(make_pool: Callable[..., RedisPool], rec: Recorder,
                                     sleeps: list[float],
                                     make_error: Callable[[], rx.ResponseError]) -> None:
    block = Script((make_error(), 0), ("done", 1))
    assert make_pool().run(block) == "done"
    assert block.runs == 2
    assert rec.actions == [("retry", 1)]
    assert sleeps == []


@pytest.mark.parametrize("make_error", [
    lambda: ConnectError("refused"),
    read_only,
    lambda: rx.ConnectionError("Connection closed by server."),
    lambda: rx.TimeoutError("Timeout reading from socket"),
])
def test_non_idempotent_block_with_a_completed_round_trip_is_not_replayed(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float],
        make_error: Callable[[], BaseException]) -> None:
    error = make_error()
    block = Script((error, 1), ("never", 0))  # one round trip done, then the failure
    with pytest.raises(type(error)):
        make_pool().run(block)
    assert block.runs == 1
    assert rec.actions == [("unsafe", 1)]
    assert sleeps == []


def test_idempotent_block_with_a_completed_round_trip_is_replayed(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float]) -> None:
    block = Script((rx.ConnectionError("closed"), 1), ("done", 2))
    assert make_pool().run(block, idempotent=True) == "done"
    assert block.runs == 2
    assert rec.actions == [("retry", 1)]
    assert sleeps == pytest.approx(expected_backoff(1, 0.5, 4.0))


@pytest.mark.parametrize("make_error", [
    lambda: rx.AuthenticationError("invalid username-password pair"),
    lambda: rx.AuthorizationError("NOPERM"),
    lambda: rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
    lambda: rx.ResponseError("ERR syntax error"),
    lambda: ValueError("a bug in the block"),
])
@pytest.mark.parametrize("idempotent", [False, True])
def test_other_errors_propagate_untouched_and_unreported(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float],
        make_error: Callable[[], BaseException], idempotent: bool) -> None:
    error = make_error()
    block = Script((error, 0), ("never", 0))
    with pytest.raises(type(error)) as raised:
        make_pool().run(block, idempotent=idempotent)
    assert raised.value is error
    assert block.runs == 1
    assert rec.calls == []
    assert sleeps == []


def test_transient_failures_then_success(make_pool: Callable[..., RedisPool], rec: Recorder,
                                         sleeps: list[float]) -> None:
    block = Script((ConnectError("refused"), 0), (ConnectError("refused"), 0), ("ok", 1))
    assert make_pool().run(block) == "ok"
    assert block.runs == 3
    assert rec.actions == [("retry", 1), ("retry", 2)]
    assert sleeps == pytest.approx(expected_backoff(2, 0.5, 4.0))
    assert len(set(map(id, block.conns))) == 1  # the block keeps its checked-out Conn


def test_failover_then_dial_failures_keep_counting_attempts(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float]) -> None:
    block = Script((read_only(), 0), (ConnectError("refused"), 0), ("ok", 1))
    assert make_pool().run(block) == "ok"
    assert rec.actions == [("retry", 1), ("retry", 2)]
    assert len(sleeps) == 1  # no pause after the failover, a backoff after the dial
    assert 1.0 <= sleeps[0] <= 1.5  # the delay of attempt 2


def test_backoff_sleeps_are_capped(make_pool: Callable[..., RedisPool], rec: Recorder,
                                   sleeps: list[float]) -> None:
    pool = make_pool(retry=RetrySettings(max_attempts=7, base=1.0, cap=3.0))
    with pytest.raises(ConnectError):
        pool.run(Script((ConnectError("refused"), 0)))
    assert rec.actions[-1] == ("exhausted", 7)
    assert len(sleeps) == 6
    floors = [1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    for floor, slept in zip(floors, sleeps, strict=True):
        assert floor <= slept <= floor * 1.5
    assert sleeps == pytest.approx(expected_backoff(6, 1.0, 3.0))


def test_single_attempt_setting_exhausts_at_once(make_pool: Callable[..., RedisPool],
                                                 rec: Recorder, sleeps: list[float]) -> None:
    pool = make_pool(retry=RetrySettings(max_attempts=1))
    block = Script((ConnectError("refused"), 0), ("never", 0))
    with pytest.raises(ConnectError):
        pool.run(block)
    assert block.runs == 1
    assert rec.actions == [("exhausted", 1)]
    assert sleeps == []


def test_connection_is_closed_after_transport_errors_but_kept_after_error_replies(
        make_pool: Callable[..., RedisPool], monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[Conn] = []
    original = Conn.close

    def close(self: Conn) -> None:
        closed.append(self)
        original(self)

    monkeypatch.setattr(Conn, "close", close)
    pool = make_pool()
    with pytest.raises(rx.ResponseError):
        pool.run(Script((rx.ResponseError("WRONGTYPE wrong kind"), 1)))
    assert closed == []  # the stream is in step: the connection stays usable
    with pytest.raises(rx.ConnectionError):
        pool.run(Script((rx.ConnectionError("closed"), 0)))
    assert len(closed) == 1
    with pytest.raises(KeyboardInterrupt):
        pool.run(Script((KeyboardInterrupt(), 0)))
    assert len(closed) == 2  # interrupted mid-command: never reuse the stream as is


def test_successful_run_returns_the_connection_to_the_pool(
        make_pool: Callable[..., RedisPool]) -> None:
    pool = make_pool(size=1)
    first = Script(("a", 1))
    second = Script(("b", 1))
    assert pool.run(first) == "a"
    assert pool.run(second) == "b"
    assert first.conns[0] is second.conns[0]


# -- checkout starvation -------------------------------------------------------

class Holder:
    """Holds the pool's only connection in another thread until released."""

    def __init__(self, pool: RedisPool) -> None:
        self.pool = pool
        self.held = threading.Event()
        self.release = threading.Event()
        self.conn: Conn | None = None
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.held.wait(5)

    def _hold(self) -> None:
        with self.pool.conn() as conn:
            self.conn = conn
            self.held.set()
            self.release.wait(10)

    def stop(self) -> None:
        self.release.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_starved_checkout_is_retried_once_then_gives_up(
        make_pool: Callable[..., RedisPool], rec: Recorder, sleeps: list[float]) -> None:
    pool = make_pool(size=1, retry=RetrySettings(checkout_timeout=0.05))
    holder = Holder(pool)
    block = Script(("never", 0))
    try:
        with pytest.raises(PoolExhausted):
            pool.run(block)
    finally:
        holder.stop()
    assert block.runs == 0
    assert rec.actions == [("retry", 1), ("give_up", 2)]
    assert all(isinstance(e, PoolExhausted) for e, _, _ in rec.calls)
    assert len(sleeps) == 1 and 0.05 <= sleeps[0] <= 0.1


def test_starved_checkout_succeeds_when_the_connection_comes_free(
        make_pool: Callable[..., RedisPool], rec: Recorder) -> None:
    slept: list[float] = []
    holder: Holder | None = None

    def free_it(seconds: float) -> None:
        slept.append(seconds)
        assert holder is not None
        holder.stop()  # the other thread checks its connection back in

    pool = make_pool(size=1, retry=RetrySettings(checkout_timeout=0.05), sleep=free_it)
    holder = Holder(pool)
    block = Script(("done", 1))
    try:
        assert pool.run(block) == "done"
    finally:
        holder.stop()
    assert block.runs == 1
    assert block.conns[0] is holder.conn  # the freed connection, not a new one
    assert rec.actions == [("retry", 1)]
    assert len(slept) == 1


def test_checkout_waits_for_a_connection_checked_in_meanwhile(
        make_pool: Callable[..., RedisPool], rec: Recorder) -> None:
    pool = make_pool(size=1, retry=RetrySettings(checkout_timeout=5.0))
    holder = Holder(pool)
    timer = threading.Timer(0.05, holder.release.set)
    timer.start()
    try:
        assert pool.run(Script(("done", 1))) == "done"
    finally:
        timer.join()
        holder.stop()
    assert rec.calls == []


# -- fork ------------------------------------------------------------------------

def client_id(conn: Conn) -> tuple[Conn, int]:
    return conn, int(conn.call("CLIENT", "ID"))


def child_report(pool: RedisPool, parent_conn: Conn, wfd: int) -> None:
    """In the child: use the pool, write what was seen to the pipe, exit."""
    code = 1
    try:
        idle_after_fork = len(pool.idle_connections())
        conn, cid = pool.run(client_id)
        report = {"idle_after_fork": idle_after_fork, "reused": conn is parent_conn,
                  "cid": cid, "parent_copy_closed": parent_conn.raw._sock is None}
        os.write(wfd, json.dumps(report).encode())
        code = 0
    except Exception as exc:  # noqa: BLE001 - the child must never unwind into pytest
        os.write(wfd, json.dumps({"error": repr(exc)}).encode())
    finally:
        os._exit(code)


def collect(pid: int, rfd: int, wfd: int) -> dict[str, Any]:
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 4096):
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


@pytest.fixture
def live_pool(redis_server: RedisServer, make_pool: Callable[..., RedisPool]) -> RedisPool:
    reap_probe_clients()
    return make_pool(url=redis_server.url, size=2)


def test_forked_child_never_reuses_the_parents_idle_connection(live_pool: RedisPool) -> None:
    parent_conn, parent_cid = live_pool.run(client_id)
    assert live_pool.idle_connections() == [parent_conn]
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        child_report(live_pool, parent_conn, wfd)
    report = collect(pid, rfd, wfd)
    assert report["idle_after_fork"] == 0
    assert report["reused"] is False
    assert report["parent_copy_closed"] is True
    assert report["cid"] != parent_cid  # the child dialed its own connection
    # The child closed only its copy: the parent's socket still works, same session.
    conn, cid = live_pool.run(client_id)
    assert conn is parent_conn
    assert cid == parent_cid
    assert live_pool.call("ECHO", "still here") == b"still here"


def test_connection_checked_out_across_fork_is_dropped_in_the_child(
        live_pool: RedisPool) -> None:
    seen: dict[str, Any] = {}

    def fork_inside(conn: Conn) -> int:
        seen["conn"], seen["cid"] = client_id(conn)
        return os.fork()

    rfd, wfd = os.pipe()
    pid = live_pool.run(fork_inside)
    if pid == 0:
        # run() checked the parent's Conn back in; in the child it must be dropped.
        child_report(live_pool, seen["conn"], wfd)
    report = collect(pid, rfd, wfd)
    assert report["idle_after_fork"] == 0
    assert report["reused"] is False
    assert report["cid"] != seen["cid"]
    conn, cid = live_pool.run(client_id)
    assert conn is seen["conn"]
    assert cid == seen["cid"]

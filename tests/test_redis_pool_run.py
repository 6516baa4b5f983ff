"""``RedisPool.run`` with injected faults: what is replayed, after which
backoff, what is never replayed, what is reported, which connections are
closed or kept; and a starved checkout, retried once.

Fake blocks raise chosen exceptions (and bump ``conn.round_trips`` to
simulate a completed round trip); sleeps, jitter and the error hook are
injected (tests/pools.py), so nothing here waits or touches Redis.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pools
import pytest
import redis.exceptions as rx
from recording import Recorder
from waiting import EVENTUALLY

from wurk.redis.connection import Conn
from wurk.redis.policy import ConnectError, PoolExhausted
from wurk.redis.pool import RedisPool, RetrySettings

rec = pools.rec
sleeps = pools.sleeps
make_pool = pools.make_pool


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
        assert self.held.wait(EVENTUALLY)

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

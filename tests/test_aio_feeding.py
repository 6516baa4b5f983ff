"""How the asyncio executor's feeder takes places and jobs (issue #17).

With reliable fetch one feeder thread takes every free place and fills them
with one claim (``HandOver.take_many``), instead of a thread per job. These
tests drive the hand-over and the places directly, with a real fetcher-like
thread, and check the counts the fetcher claims by stay exact.
"""

from __future__ import annotations

import threading
import time

import pytest
from waiting import wait_for

from wurk.runtime.aio_manager import Places
from wurk.runtime.handover import HandOver
from wurk.runtime.work import UnitOfWork

pytestmark = pytest.mark.timeout(30)


def work(n: int) -> UnitOfWork:
    return UnitOfWork("default", f'{{"class":"J","args":[{n}]}}'.encode())


class Claimer:
    """A fetcher stand-in: whenever takers wait with no job on its way, it
    "claims" ``per_claim`` at most (None: all of the shortfall) in one go."""

    def __init__(self, per_claim: int | None = None) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.closed = False
        self.handover = HandOver(self.lock, self.wake, 2.0, lambda: self.closed)
        self.per_claim = per_claim
        self.claims: list[int] = []
        self.stopping = False
        self.numbers = iter(range(1_000_000))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.lock:
            while not self.stopping:
                want = self.handover.shortfall()
                if want <= 0:
                    self.wake.wait(0.05)
                    continue
                count = want if self.per_claim is None else min(want, self.per_claim)
                self.claims.append(count)
                for _ in range(count):
                    self.handover.put(work(next(self.numbers)))

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.wake.notify_all()
        self.thread.join(5)


def test_one_take_gets_a_whole_claim_and_the_counts_return_to_zero() -> None:
    claimer = Claimer()
    try:
        taken = claimer.handover.take_many(50)
        assert len(taken) == 50
        assert claimer.claims == [50]  # one claim for all fifty
        assert len({w.raw for w in taken}) == 50
        with claimer.lock:
            assert claimer.handover.waiting == 0 and claimer.handover.pending == 0
    finally:
        claimer.stop()


def test_jobs_beyond_what_was_asked_wait_for_the_next_take() -> None:
    claimer = Claimer(per_claim=3)
    try:
        first = claimer.handover.take_many(10)
        assert 1 <= len(first) <= 10
        claimer.stop()
        # Jobs claimed for the taker after it left stay counted as on their way.
        with claimer.lock:
            leftover = claimer.handover.pending
        assert len(claimer.handover.take_many(100)) == leftover
        with claimer.lock:
            for n in range(4):
                claimer.handover.put(work(900 + n))
        second = claimer.handover.take_many(2)
        third = claimer.handover.take_many(2)
        assert [w.raw for w in second + third] == [work(900 + n).raw for n in range(4)]
        with claimer.lock:
            assert claimer.handover.pending == 0
    finally:
        claimer.stop()


def test_a_closed_fetch_gives_nothing_at_once() -> None:
    lock = threading.Lock()
    # No fetcher ever answers: a take that waited would wait the whole 30 s.
    handover = HandOver(lock, threading.Condition(lock), 30.0, lambda: True)
    started = time.monotonic()
    assert handover.take_many(10) == []
    assert time.monotonic() - started < 5.0  # at once, not the 30 s fetch timeout
    assert handover.waiting == 0


def test_a_stops_wake_up_ends_a_waiting_take() -> None:
    lock = threading.Lock()
    # Left alone, the take waits out its 30 s fetch timeout.
    handover = HandOver(lock, threading.Condition(lock), 30.0, lambda: False)
    got: list[list[UnitOfWork]] = []
    taker = threading.Thread(target=lambda: got.append(handover.take_many(5)), daemon=True)
    taker.start()
    wait_for(lambda: handover.waiting, 10, what="the taker waits")
    assert handover.waiting == 5
    handover.release_waiters()
    taker.join(10)  # the wake-up, not the timeout, ends the take
    assert not taker.is_alive() and got == [[]]
    assert handover.waiting == 0 and handover.pending == 0


def test_places_are_taken_all_at_once_and_never_overgiven() -> None:
    places = Places(4)
    assert places.take(10, timeout=0.1) == 4
    assert places.take(1, timeout=0.05) == 0  # none free: waits, then nothing
    threading.Timer(0.1, places.give, args=(2,)).start()
    assert places.take(10, timeout=5) == 2
    places.give(4)
    with pytest.raises(ValueError):
        places.give(1)

"""Quiet and stop wake every thread waiting for a claimed job, each exactly once.

The waits use a timeout far longer than the test's patience: a waiter whose
wake-up another thread took would sit out that timeout (or, on CPython 3.11,
past it until the next put), and the test sees it still waiting.
"""

from __future__ import annotations

import threading

from waiting import EVENTUALLY, wait_for

from wurk.runtime.handover import HandOver
from wurk.runtime.work import UnitOfWork

LONG_WAIT = 3600.0


def waiting_takers(handover: HandOver, count: int) -> tuple[list[threading.Thread], list[object]]:
    got: list[object] = []

    def take() -> None:
        got.append(handover.take())

    takers = [threading.Thread(target=take, daemon=True) for _ in range(count)]
    for taker in takers:
        taker.start()
    wait_for(lambda: handover.waiting == count, what=f"{count} takers waiting")
    return takers, got


def test_each_waiter_takes_one_wake_up_and_all_return() -> None:
    lock = threading.Lock()
    closed = threading.Event()
    handover = HandOver(lock, threading.Condition(lock), LONG_WAIT, closed.is_set)
    for _ in range(20):  # the steal needs one waiter to run before the others: try often
        takers, got = waiting_takers(handover, 8)
        with lock:
            closed.set()
            handover.release_waiters()
        for taker in takers:
            taker.join(EVENTUALLY)
        assert not any(t.is_alive() for t in takers), "a waiter lost its wake-up"
        assert got == [None] * 8
        with lock:
            assert handover.waiting == 0 and handover.pending == 0
        closed.clear()


def test_taking_the_unstarted_jobs_leaves_the_wake_ups() -> None:
    lock = threading.Lock()
    closed = threading.Event()
    handover = HandOver(lock, threading.Condition(lock), LONG_WAIT, closed.is_set)
    takers, got = waiting_takers(handover, 3)
    # A stop wakes the waiters, then empties the queue of claimed jobs before
    # every waiter has run: the wake-ups must survive that.
    with lock:
        closed.set()
        handover.release_waiters()
        handover.put(UnitOfWork("default", b"{}"))
        taken = handover.take_all()
    assert [w.raw for w in taken] == [b"{}"]
    for taker in takers:
        taker.join(EVENTUALLY)
    assert not any(t.is_alive() for t in takers)
    assert got == [None] * 3

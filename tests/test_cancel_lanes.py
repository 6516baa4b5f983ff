"""The cancel step's promise at a run's edges: a cancel fired while runs end and
begin back to back on one thread lands in the run it was meant for or in none,
never in the next run and never in the code between runs.

Real threads and real asynchronous exceptions (``PyThreadState_SetAsyncExc``,
as the watch fires them); no Redis: the step is asked directly, as the watch asks it.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from waiting import EVENTUALLY

import wurk
from wurk.core.job_errors import JobCancelled
from wurk.runtime import cancelling
from wurk.runtime.cancelling import CancelStep

# Runs go on until this many were cut by a cancel (or MOST_RUNS ran).
HITS = 50
MOST_RUNS = 200_000


def as_run(jid: str, slot: str = "slot-0") -> Any:
    return SimpleNamespace(jid=jid, slot=slot, work=object(), abandoned=lambda wait: False)


def short_run(jid: str) -> str:
    # Short runs: some cut at a bytecode, some ending just as the cancel fires.
    total = 0
    for i in range(50):
        total += i
    return jid


class BackToBack:
    """One worker thread running short runs back to back through the step."""

    def __init__(self, step: CancelStep) -> None:
        self.step = step
        self.outcomes: dict[str, Any] = {}
        self.escaped: list[BaseException] = []
        self.finished = threading.Event()

    def work(self) -> None:
        try:
            hits = 0
            for n in range(MOST_RUNS):
                jid = f"j{n}"
                call = self.step.around(as_run(jid), lambda jid=jid: short_run(jid))
                try:
                    self.outcomes[jid] = outcome = call()
                except JobCancelled as raised:  # the run's own failure: allowed
                    self.outcomes[jid] = outcome = raised
                hits += isinstance(outcome, JobCancelled)
                if hits == HITS:
                    return
        except BaseException as exc:  # noqa: BLE001 - anything here escaped a run
            self.escaped.append(exc)
        finally:
            self.finished.set()


@pytest.fixture
def switching() -> Iterator[None]:
    """Threads switch often, so the canceller meets runs at every point of them."""
    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    # No collection meanwhile: an earlier test's garbage finalized on the
    # worker thread would take a JobCancelled into its __del__, where CPython
    # swallows it (an unraisable-exception warning). That is a limit of async
    # exceptions, not of the lanes, whose edges are what this test checks.
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        sys.setswitchinterval(was)


@pytest.mark.usefixtures("switching")
def test_a_cancel_fired_at_the_edges_of_runs_lands_only_in_its_own_run() -> None:
    step = CancelStep()
    worker = BackToBack(step)
    aimed: set[str] = set()

    def canceller() -> None:
        while not worker.finished.is_set():
            for jid in step.running_jids():
                aimed.add(jid)
                step.cancel(jid)

    threads = [threading.Thread(target=worker.work), threading.Thread(target=canceller)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(EVENTUALLY * 3)
    assert not any(thread.is_alive() for thread in threads)
    assert not worker.escaped, worker.escaped
    outcomes = worker.outcomes
    hit = {jid for jid, outcome in outcomes.items() if isinstance(outcome, JobCancelled)}
    assert len(hit) == HITS, f"{len(hit)} runs cut in {len(outcomes)}: the test checked too little"
    assert hit <= aimed, sorted(hit - aimed)[:5]
    assert all(outcome == jid for jid, outcome in outcomes.items() if jid not in hit)
    assert step.running_jids() == []


def test_a_thread_reads_its_own_runs_cancel_and_the_next_run_starts_clear() -> None:
    step = CancelStep()
    seen: list[tuple[bool, bool]] = []
    started, fired = threading.Event(), threading.Event()

    def cancelled_run() -> BaseException | None:
        # As the processor's perform does: the job's failure comes back as a value.
        started.set()
        try:
            fired.wait(EVENTUALLY)
            while True:  # until the JobCancelled lands
                pass
        except JobCancelled as failure:
            seen.append((wurk.cancelled(), True))
            return failure

    def next_run() -> None:
        seen.append((wurk.cancelled(), False))

    def worker() -> None:
        assert isinstance(step.around(as_run("first"), cancelled_run)(), JobCancelled)
        assert step.around(as_run("second"), next_run)() is None

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(EVENTUALLY)
    assert step.running_jids() == ["first"]
    assert step.cancel("first") == 1
    assert step.cancel("first") == 0  # once per run
    fired.set()
    thread.join(EVENTUALLY)
    assert not thread.is_alive()
    assert seen == [(True, True), (False, False)]
    assert not wurk.cancelled()  # outside any run


def test_a_cancel_that_reaches_the_loop_after_its_task_ended_is_dropped() -> None:
    step = CancelStep()
    loop = asyncio.new_event_loop()
    seen: list[Any] = []

    async def first() -> str:
        # The watch finds this run, and its cancel is on its way to the loop...
        [target] = step._tasks.values()
        seen.append(target)
        return "first"

    async def second() -> str:
        for _ in range(5):
            await asyncio.sleep(0)  # ...arriving now: it must not cancel this run
        return "second"

    async def runs() -> list[Any]:
        done = [await step.around_async(as_run("a1"), first)()]
        assert step.cancel("a1") == 0  # over: the watch finds nothing to fire
        # A cancel fired while a1 still ran reaches the loop only now.
        seen[0].fired = True
        cancelling._cancel_task(seen[0])
        done.append(await step.around_async(as_run("a2"), second)())
        return done

    try:
        assert loop.run_until_complete(runs()) == ["first", "second"]
    finally:
        loop.close()


def test_after_a_cancelled_run_its_thread_reads_no_cancel_outside_a_run() -> None:
    # The lane's flag stays the thread's CURRENT between runs: what the thread
    # does next, outside a run (or in a run the step does not track, one
    # without a jid), must not read the last run's cancel.
    step = CancelStep()
    seen: list[bool] = []
    started, fired = threading.Event(), threading.Event()

    def cancelled_run() -> BaseException | None:
        started.set()
        try:
            fired.wait(EVENTUALLY)
            while True:  # until the JobCancelled lands
                pass
        except JobCancelled as failure:
            return failure

    def untracked_run() -> None:
        seen.append(wurk.cancelled())

    def worker() -> None:
        assert isinstance(step.around(as_run("first"), cancelled_run)(), JobCancelled)
        seen.append(wurk.cancelled())
        step.around(SimpleNamespace(jid=None, slot="slot-0", work=object()), untracked_run)()

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(EVENTUALLY)
    assert step.cancel("first") == 1
    fired.set()
    thread.join(EVENTUALLY)
    assert not thread.is_alive()
    assert seen == [False, False]

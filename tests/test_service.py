"""The background-service base: start once, guarded steps, wait/wake, stop and join."""

from __future__ import annotations

import threading

from structlog.testing import capture_logs
from waiting import wait_for

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.core.service import Service, logged

log = get_logger("tests.service")


def counting(steps: list[int], pause: float | None = 0.01) -> Service:
    return Service("test-count", lambda: steps.append(1) or pause, name="wurk-test-count",
                   failed=logged(log, "test.error", 0.01))


def test_it_starts_once_on_a_named_supervised_thread_and_stop_joins_it() -> None:
    steps: list[int] = []
    service = counting(steps)
    assert service.start()
    try:
        assert not service.start()  # a second start is a no-op
        thread = service.thread
        assert thread is not None and thread.name == "wurk-test-count" and thread.daemon
        wait_for(lambda: len(steps) >= 3, timeout=10, what="steps")
        assert "test-count" not in threads.dead()
    finally:
        assert service.stop(10)
    assert not thread.is_alive() and not service.alive()
    assert not service.start()  # stop is terminal


def test_a_failing_step_is_logged_retried_and_counted_then_reset() -> None:
    outcomes = iter([ValueError("one"), SystemExit(3), None, None])
    seen: list[int] = []

    def step() -> float:
        outcome = next(outcomes, None)
        if outcome is not None:
            raise outcome
        return 0.01

    def failed(exc: BaseException, failures: int) -> float:
        seen.append(failures)
        return logged(log, "test.step_failed", 0.01)(exc, failures) or 0.0

    service = Service("test-fail", step, failed=failed)
    with capture_logs() as logs:
        service.start()
        try:
            wait_for(lambda: service.failures == 0 and len(seen) == 2, timeout=10,
                     what="two failures, then a step that returned")
        finally:
            service.stop(10)
    assert seen == [1, 2]
    errors = [e["error"] for e in logs if e["event"] == "test.step_failed"]
    assert errors == ["ValueError: one", "SystemExit: 3"]
    assert not [e for e in logs if e["event"] == "thread.died"]


def test_wait_ends_on_wake_without_stopping_and_at_once_once_stopped() -> None:
    service = Service("test-wait", lambda: None, failed=logged(log, "test.error", 0.0))
    woke = threading.Event()
    results: list[bool] = []

    def waiter() -> None:
        results.append(service.wait(None))
        woke.set()

    threading.Thread(target=waiter, daemon=True).start()
    service.wake()
    assert woke.wait(10) and results == [False]
    service.stop()
    assert service.wait(None) is True  # stopped: no wait at all
    assert service.stopping


def test_a_step_may_stop_its_own_service_and_finish_runs_once_on_its_thread() -> None:
    finished: list[threading.Thread] = []
    holder: list[Service] = []

    def step() -> None:
        holder[0].stop()  # from the loop's own thread: no join, the loop ends after this
        return None

    service = Service("test-self-stop", step, failed=logged(log, "test.error", 0.0),
                      finish=lambda: finished.append(threading.current_thread()))
    holder.append(service)
    service.start()
    wait_for(lambda: finished, timeout=10, what="the finish hook")
    assert finished == [service.thread]
    assert service.stop(10)


def test_a_long_first_pause_is_cut_short_by_stop() -> None:
    steps: list[int] = []
    service = Service("test-first", lambda: steps.append(1) or 0.01,
                      failed=logged(log, "test.error", 0.0), first_pause=3600.0)
    service.start()
    assert service.stop(10)  # joined: the hour-long first pause ended at once
    assert steps == []

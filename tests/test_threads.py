"""Thread supervision: loops that die are reported and restarted, and /live says so."""

from __future__ import annotations

import dataclasses
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs
from test_health import get
from tuning import tuned
from waiting import wait_for

from supervisor import child_boot
from wurk.core import threads
from wurk.core.threads import ThreadSupervisor
from wurk.push.job import JobFunction
from wurk.runtime import reaper
from wurk.runtime.launcher import Launcher
from wurk.runtime.manager import Manager
from wurk.runtime.processor import Processor
from wurk.settings.config import Config
from wurk.wire import keys

Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]



def once(exc: BaseException, then: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in that raises ``exc`` on its first call and defers to ``then`` after."""
    calls: list[int] = []

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return then(*args, **kwargs)

    stand_in.calls = calls  # type: ignore[attr-defined]
    return stand_in


# -- the supervisor ------------------------------------------------------------------------


def test_a_loop_that_dies_is_reported_and_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "RESTART_PAUSE", 0.5)
    supervisor = ThreadSupervisor()
    release = threading.Event()
    runs: list[int] = []

    def loop() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RecursionError("deep")
        release.wait(5)

    with capture_logs() as logs:
        supervisor.start("worker", loop)
        assert wait_for(lambda: supervisor.dead() == ["worker"], what="reported dead")
        wait_for(lambda: len(runs) == 2, what="restarted")
    assert supervisor.dead() == []
    report = supervisor.report()
    assert report["deaths"] == {"worker": 1} and report["replaced"] == {"worker": 1}
    assert report["last_death"]["error"] == "RecursionError: deep"
    died = [e for e in logs if e["event"] == "thread.died"]
    assert died[0]["role"] == "worker" and died[0]["error"] == "RecursionError: deep"
    assert any(e["event"] == "thread.replaced" for e in logs)
    release.set()


def test_restarts_back_off_while_a_loop_keeps_dying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "RESTART_PAUSE", 0.1)
    supervisor = ThreadSupervisor()
    starts: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        starts.append(time.monotonic())
        raise SystemExit("again")

    supervisor.start("flaky", loop, stopped=stop.is_set)
    wait_for(lambda: len(starts) >= 4, what="three restarts")
    stop.set()
    gaps = [b - a for a, b in itertools.pairwise(starts)][:3]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4  # doubling, no spin
    wait_for(lambda: supervisor.dead() == [], what="a stopped loop is not dead")


@pytest.mark.parametrize(("stable_run", "expected"), [
    (60.0, [0.01, 0.02, 0.04, 0.04, 0.04]),  # quick deaths: doubling up to the max
    (0.0, [0.01] * 5),                       # each run "stable": the shortest pause again
])
def test_restart_pauses_are_capped_and_reset_after_a_stable_run(
        monkeypatch: pytest.MonkeyPatch, stable_run: float, expected: list[float]) -> None:
    monkeypatch.setattr(threads, "RESTART_PAUSE", 0.01)
    monkeypatch.setattr(threads, "RESTART_PAUSE_MAX", 0.04)
    monkeypatch.setattr(threads, "STABLE_RUN", stable_run)
    supervisor = ThreadSupervisor()
    release = threading.Event()
    runs: list[int] = []

    def loop() -> None:
        runs.append(1)
        if len(runs) <= len(expected):
            raise SystemExit("again")
        release.wait(5)

    with capture_logs() as logs:
        supervisor.start("flaky", loop)
        wait_for(lambda: len(runs) > len(expected), what="every restart")
    release.set()
    assert [e["restart_in"] for e in logs if e["event"] == "thread.died"] == expected


def test_a_loop_that_ends_or_dies_once_stopped_is_not_restarted() -> None:
    supervisor = ThreadSupervisor()
    stop = threading.Event()
    stop.set()
    runs: list[int] = []

    def dies() -> None:
        runs.append(1)
        raise SystemExit("while stopping")

    ended = supervisor.start("done", lambda: None)
    dying = supervisor.start("stopping", dies, stopped=stop.is_set)
    ended.join(2)
    dying.join(2)
    assert not ended.is_alive() and not dying.is_alive()
    assert runs == [1]
    assert supervisor.dead() == []
    assert supervisor.report()["deaths"] == {"stopping": 1}


def test_a_thread_gone_while_registered_counts_as_dead() -> None:
    """The net under the net: if even the supervision fails, /live still says so."""
    supervisor = ThreadSupervisor()
    release = threading.Event()
    thread = supervisor.start("broken", lambda: release.wait(5))
    entry = next(iter(supervisor._entries))
    supervisor._entries.clear()  # as if the wrapper itself had failed ...
    release.set()
    thread.join(2)
    supervisor._entries.add(entry)  # ... leaving its entry behind
    assert supervisor.dead() == ["broken"]


# -- processor threads -----------------------------------------------------------------------


def test_a_dead_processor_is_replaced_and_live_reports_it(
        config: Config, define: Define, launch_with: Launch,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "RESTART_PAUSE", 3.0)  # a window wide enough to see
    before = threads.report()["deaths"].get("processor", 0)
    monkeypatch.setattr(Manager, "_work_loop",
                        once(SystemExit("injected"), Manager._work_loop))
    launcher = launch_with(dataclasses.replace(config, concurrency=2,
                                               health_listen="127.0.0.1:0"))
    assert launcher.health is not None
    port = launcher.health.port
    status, body = wait_for(lambda: (reply := get(port, "/live"))[0] == 503 and reply,
                            what="/live reporting the dead processor")
    assert body["status"] == "thread_dead" and body["threads"]["dead"] == ["processor"]
    assert body["threads"]["last_death"]["error"] == "SystemExit: injected"

    # Full concurrency again: two jobs that can only finish together.
    barrier = threading.Barrier(2, timeout=8)
    met: list[int] = []

    def meet() -> None:
        barrier.wait()
        met.append(1)

    job = define(meet, retry=False)
    job.perform_async()
    job.perform_async()
    wait_for(lambda: len(met) == 2, timeout=15, what="both jobs running side by side")
    status, body = get(port, "/live")
    assert status == 200 and body["status"] == "live"
    assert body["threads"]["dead"] == []
    assert body["threads"]["deaths"]["processor"] == before + 1
    assert body["threads"]["replaced"]["processor"] >= before + 1


@pytest.mark.parametrize("reliable", [True, False])
def test_a_processor_failing_outside_its_job_gives_the_job_back(
        r: redis.Redis, config: Config, define: Define, launch: Launch,
        monkeypatch: pytest.MonkeyPatch, reliable: bool) -> None:
    config = tuned(config, concurrency=1, reliable_fetch=reliable)
    monkeypatch.setattr(Processor, "process", once(KeyboardInterrupt(), Processor.process))
    ran: list[int] = []
    job = define(lambda: ran.append(1))
    with capture_logs() as logs:
        job.perform_async()
        launcher = launch()
        wait_for(lambda: ran == [1], what="the job, given back and run")
    assert any(e["event"] == "processor.error" and e["error"] == "KeyboardInterrupt: "
               for e in logs)
    launcher.stop()
    assert ran == [1]
    assert r.llen("queue:default") == 0
    assert not [k for k in r.keys(keys.wip("*", "*")) if r.type(k) == "list" and r.llen(k)]


# -- every other loop survives a BaseException injected once -----------------------------------


def test_the_heartbeat_outlives_a_base_exception(config: Config, launch: Launch,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = launch()
    heartbeat = launcher.heartbeat
    stand_in = once(SystemExit("injected"), heartbeat.beat)
    monkeypatch.setattr(heartbeat, "beat", stand_in)
    wait_for(lambda: len(stand_in.calls) >= 1, what="the failing beat")  # type: ignore[attr-defined]
    failed_at = time.monotonic()
    wait_for(lambda: (heartbeat.last_beat or 0) > failed_at, what="a beat after the failure")


def test_the_reaper_outlives_a_base_exception(r: redis.Redis, config: Config, launch: Launch,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = tuned(config, reaper_interval=0.2)
    stand_in = once(SystemExit("injected"), reaper.sweep)
    monkeypatch.setattr(reaper, "sweep", stand_in)
    launch()
    wait_for(lambda: len(stand_in.calls) >= 1, what="the failing sweep")  # type: ignore[attr-defined]
    # A dead process's private list, found by a later sweep.
    r.sadd(keys.WIP_OWNERS, "gone:1:abc")
    r.sadd(keys.wip_queues("gone:1:abc"), "lost")
    r.lpush(keys.wip("gone:1:abc", "lost"), json.dumps({"class": "X", "args": [], "jid": "j1"}))
    wait_for(lambda: r.llen("queue:lost") == 1, what="a sweep after the failure")


def test_the_fetcher_outlives_a_base_exception(config: Config, define: Define, launch: Launch,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ran = threading.Event()
    job = define(ran.set)
    launcher = launch()
    fetch = launcher.manager.fetch
    monkeypatch.setattr(fetch, "_claim", once(SystemExit("injected"), fetch._claim))  # type: ignore[attr-defined]
    job.perform_async()
    assert ran.wait(8), "no job ran after the fetcher's failure"


def test_the_health_listener_outlives_a_base_exception(
        config: Config, launch_with: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "RESTART_PAUSE", 0.2)
    launcher = launch_with(dataclasses.replace(config, health_listen="127.0.0.1:0"))
    assert launcher.health is not None and launcher.health._server is not None
    server = launcher.health._server
    with capture_logs() as logs:
        monkeypatch.setattr(server, "service_actions",
                            once(SystemExit("injected"), server.service_actions))
        wait_for(lambda: any(e["event"] == "thread.died" for e in logs), what="the death")
    assert get(launcher.health.port, "/live")[0] == 200


class FakeLauncher:
    """What ``title_keeper`` reads of a launcher."""

    def __init__(self) -> None:
        self.config = Config(concurrency=3)
        self.stopped = threading.Event()
        self.heartbeat = type("H", (), {"quiet": False})()
        self.manager = type("M", (), {"in_flight": type("T", (), {"busy": lambda _: 1})()})()


# The services' own guards are under test below, not the supervisor's restarts.

def test_the_childs_title_outlives_a_base_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_boot, "TITLE_REFRESH", 0.02)
    titles: list[str] = []
    monkeypatch.setattr(child_boot.setproctitle, "setproctitle",
                        once(SystemExit("injected"), titles.append))
    launcher = FakeLauncher()
    title = child_boot.title_keeper(launcher, "a", 0)  # type: ignore[arg-type]
    with capture_logs() as logs:
        title.start()
        try:
            wait_for(lambda: titles, what="a title after the failure")
            assert titles[0] == "wurk-swarm: child a#0 [1 of 3 busy]"
        finally:
            assert title.stop(2)
    assert [e["event"] for e in logs] == ["child.title_failed"]


def test_the_orphan_guard_outlives_a_base_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_boot, "ORPHAN_POLL", 0.02)
    parent = [12345]
    monkeypatch.setattr(child_boot.os, "getppid",
                        once(SystemExit("injected"), lambda: parent[0]))
    reader, writer = socket.socketpair()
    guard = child_boot.OrphanGuard(12345, writer).service
    try:
        guard.start()
        wait_for(lambda: len(child_boot.os.getppid.calls) >= 3,  # type: ignore[attr-defined]
                 what="polls after the failure")
        parent[0] = 1  # re-parented: the guard must still be watching
        reader.settimeout(5)
        assert reader.recv(1) == bytes([child_boot.signal.SIGTERM])
        wait_for(lambda: not guard.alive(), timeout=5, what="the guard ended after its TERM")
    finally:
        guard.stop(2)
        reader.close()
        writer.close()

"""wurk.runtime.signals: real signals sent to this process arrive as numbers on the pipe,
and leaving the pipe gives back the wakeup fd and handlers it found."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from wurk.runtime import launcher as launcher_module
from wurk.runtime.signals import SignalPipe, dispatch, poke, serve


@pytest.fixture
def own_wakeup() -> Iterator[socket.socket]:
    """A wakeup fd and USR1/USR2 handlers of the test's own, as a host would have."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)}
    try:
        yield reader
    finally:
        signal.set_wakeup_fd(before)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        reader.close()
        writer.close()


def test_a_handled_signal_arrives_as_its_number() -> None:
    with SignalPipe((signal.SIGUSR1, signal.SIGUSR2)) as signals:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert [signals.next(5), signals.next(5)] == [signal.SIGUSR1, signal.SIGUSR2]


def test_next_gives_none_when_the_timeout_passes_first() -> None:
    with SignalPipe((signal.SIGUSR1,)) as signals:
        started = time.monotonic()
        assert signals.next(0.2) is None
        assert 0.15 <= time.monotonic() - started < 10
        assert signals.next(0) is None


def test_numbers_that_arrive_together_come_one_at_a_time() -> None:
    with SignalPipe((signal.SIGUSR1,)) as signals:
        signals.writer.send(bytes([signal.SIGTERM, signal.SIGTSTP, 0]))
        assert [signals.next(), signals.next(1), signals.next(1)] == [
            signal.SIGTERM, signal.SIGTSTP, 0]
        assert signals.next(0) is None


def test_poke_sends_a_number_as_if_its_signal_had_arrived() -> None:
    with SignalPipe((signal.SIGUSR1,)) as signals:
        signals.poke(signal.SIGTERM)
        poke(signals.writer, 0)
        assert [signals.next(5), signals.next(5)] == [signal.SIGTERM, 0]


def test_poke_never_raises_on_a_full_or_closed_pipe() -> None:
    signals = SignalPipe((signal.SIGUSR1,))
    try:
        for _ in range(1_000_000):
            try:
                signals.writer.send(b"x" * 4096)
            except BlockingIOError:
                break
        signals.poke(signal.SIGTERM)  # full: the pipe already holds a wake-up
    finally:
        signals.restore()
    signals.poke(signal.SIGTERM)  # closed


def test_ignored_signals_are_ignored_and_defaulted_ones_default() -> None:
    previous = signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        with SignalPipe((signal.SIGUSR1,), ignored=(signal.SIGUSR2,),
                        defaulted=(signal.SIGCHLD,)) as signals:
            assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGUSR2)  # would end the test process if not ignored
            os.kill(os.getpid(), signal.SIGUSR1)
            assert signals.next(5) == signal.SIGUSR1
            assert signals.next(0.1) is None
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_leaving_restores_the_previous_wakeup_fd_and_handlers(
        own_wakeup: socket.socket) -> None:
    calls: list[int] = []

    def mine(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    signal.signal(signal.SIGUSR1, mine)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    before_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before_fd, warn_on_full_buffer=False)
    usr2_before = signal.getsignal(signal.SIGUSR2)

    with SignalPipe((signal.SIGUSR1, signal.SIGUSR2), ignored=(signal.SIGHUP,)) as signals:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert signals.next(5) == signal.SIGUSR1
        assert calls == []  # the pipe's handler ran, not ours
        reader, writer = signals.reader, signals.writer

    assert signal.getsignal(signal.SIGUSR1) is mine
    assert signal.getsignal(signal.SIGUSR2) == usr2_before
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert reader.fileno() == -1 and writer.fileno() == -1
    own_wakeup.setblocking(False)
    while True:  # what reached our own wakeup fd before the pipe took over
        try:
            own_wakeup.recv(4096)
        except BlockingIOError:
            break
    os.kill(os.getpid(), signal.SIGUSR1)
    assert calls == [signal.SIGUSR1]
    own_wakeup.settimeout(5)
    assert own_wakeup.recv(64) == bytes([signal.SIGUSR1])  # our wakeup fd is back


def test_leaving_on_an_error_restores_too() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    before_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before_fd)
    with pytest.raises(RuntimeError), SignalPipe((signal.SIGUSR1,)) as signals:
        assert signal.getsignal(signal.SIGUSR1) != before
        assert signal.set_wakeup_fd(signals.writer.fileno()) == signals.writer.fileno()
        raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGUSR1) == before
    assert signal.set_wakeup_fd(before_fd) == before_fd


def test_the_swarm_parent_ignores_a_signal_number_it_has_no_command_for() -> None:
    from supervisor.cli import command_for

    assert command_for(signal.SIGTERM) == "shutdown"
    assert command_for(signal.SIGUSR2) == "status"
    # A real-time signal a preloaded module handles: no Signals member, no command.
    assert command_for(signal.SIGRTMIN + 3) is None
    assert command_for(0) is None


def test_serve_runs_each_numbers_action_until_one_gives_an_exit_status() -> None:
    done: list[str] = []
    table = {signal.SIGTSTP: lambda: done.append("quiet"),
             signal.SIGTERM: lambda: done.append("stop") or 7}
    with SignalPipe((signal.SIGUSR1,)) as signals:
        # 0 (a wake-up) and a number with no action are passed over.
        signals.writer.send(bytes([0, signal.SIGTSTP, signal.SIGUSR2, signal.SIGTERM,
                                   signal.SIGTSTP]))
        assert serve(signals, table) == 7
        assert signals.next(0) == signal.SIGTSTP  # what came after the stop is left unread
    assert done == ["quiet", "stop"]
    assert dispatch(table, None) is None


class Quietable:
    def __init__(self) -> None:
        self.quiets = 0

    def quiet(self) -> None:
        self.quiets += 1


def test_a_workers_tables_stop_on_what_each_process_names_and_quiet_on_tstp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dumps: list[int] = []
    monkeypatch.setattr(launcher_module, "dump_threads", lambda: dumps.append(1))
    worker = Quietable()
    table = launcher_module.worker_signals(worker, lambda: 3,  # type: ignore[arg-type]
                                           (signal.SIGTERM, signal.SIGINT))
    assert set(table) == {signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGTTIN}
    assert [dispatch(table, n) for n in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGINT)] == [
        None, None, 3]
    assert worker.quiets == 1 and dumps == [1]
    quiet: list[bool] = []
    waiting = launcher_module.waiting_signals(quiet)  # a swarm child: TERM alone stops
    assert set(waiting) == {signal.SIGTERM, signal.SIGTSTP, signal.SIGTTIN}
    assert dispatch(waiting, signal.SIGTSTP) is None and quiet == [True]
    assert dispatch(waiting, signal.SIGTERM) == 0

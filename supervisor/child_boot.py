"""Child boot: what a freshly forked swarm child does before and while it works.

Duties, in order:
1. Own nothing of the parent's: close the parent's pipes, reset signal
   handling (ignore SIGINT, handle TERM/TSTP/TTIN through our own wakeup
   pipe), forget Redis sockets, the default client and the statsd socket,
   re-seed random, and set up logging afresh.
2. Ask the kernel for SIGTERM when the parent dies (PR_SET_PDEATHSIG) and
   check at once that the parent is still the one that forked us.
3. Import the slot's own ``require`` modules; a failure here, or a registry
   with no job of the application's in it (``launcher.no_jobs``), is the
   application's and exits with :data:`EX_BOOT` and a clear log line (the
   parent counts those toward ``boot_failure_limit``).
4. Wait for Redis to answer (``wurk.redis.wait``): an unreachable Redis is
   an outage, not a boot error, so the child waits with backoff, logging
   each attempt, and a TERM meanwhile ends it with :data:`EX_OK`. Only a
   refusal that waiting cannot fix (a wrong password) exits with EX_BOOT.
5. Start the launcher, tell the parent we are ready (our identity on the
   ready pipe), then keep that pipe open for the heartbeat's liveness
   pulses (``supervisor.liveness``) and the job timer's hard deadlines
   (``supervisor.overrun``); keep the process title current, and
   watch for orphaning, on two service threads (``wurk.core.service``) that
   outlive any error.
6. On TERM (or orphaning) drain within shutdown_timeout and leave with
   ``os._exit`` so nothing inherited from the parent runs at exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import random
import signal
import socket
import sys
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import setproctitle

from supervisor import overrun
from supervisor.exits import EX_BOOT, EX_CRASH, EX_OK
from supervisor.liveness import pulser
from wurk.core import logging as wlog
from wurk.core.service import Service, logged
from wurk.push.buffered import flush_push_buffers
from wurk.redis.runtime import close_runtime
from wurk.redis.wait import wait_or_signal
from wurk.runtime import forking
from wurk.runtime.launcher import Launcher, stop_before_exit, waiting_signals, worker_signals
from wurk.runtime.loading import load_modules, require_jobs
from wurk.runtime.signals import SignalPipe, dispatch, poke, serve
from wurk.settings.config import Config, configure, installed_for

if TYPE_CHECKING:
    from supervisor.topology import Slot

PR_SET_PDEATHSIG = 1
# Blocked in the supervise thread, hence blocked in a child until it is ready for them.
MANAGED_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGTSTP, signal.SIGHUP, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGTTIN, signal.SIGTTOU}
ORPHAN_POLL = 0.5
TITLE_REFRESH = 1.0

log = wlog.get_logger("wurk.child")


def run_child(slot: Slot, index: int, parent_pid: int, ready_fd: int,
              inherited_fds: Iterable[int]) -> NoReturn:
    """Entry point right after ``os.fork()`` in the child; never returns."""
    code = EX_CRASH
    try:
        code = _boot_and_work(slot, index, parent_pid, ready_fd, inherited_fds)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the parent's code
        with contextlib.suppress(BaseException):
            log.error("child.crashed", slot=slot.name, index=index,
                      error=traceback.format_exc())
    finally:
        with contextlib.suppress(BaseException):
            # os._exit skips atexit, so send what the push buffer still holds.
            flush_push_buffers()
        with contextlib.suppress(BaseException):
            wlog.flush()  # batched info lines: os._exit skips the atexit flush too
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _boot_and_work(slot: Slot, index: int, parent_pid: int, ready_fd: int,
                   inherited_fds: Iterable[int]) -> int:
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    signals = _own_signals()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, MANAGED_SIGNALS)
    # The config installed, which an integration may have changed (Config is frozen).
    slot = dataclasses.replace(slot, config=reset_after_fork(slot))
    # Built once, after the reset: the child's own pools, handed to all it starts.
    runtime = slot.runtime
    # Every line this child writes says which slot and index it serves.
    wlog.bind_process(slot=slot.name, index=index)
    set_parent_death_signal()
    if os.getppid() != parent_pid:
        log.warning("child.orphaned_at_boot", slot=slot.name, index=index)
        return EX_OK
    setproctitle.setproctitle(f"wurk-swarm: child {slot.name}#{index} booting")
    os.environ.update(slot.env)
    quiet: list[bool] = []
    waiting = waiting_signals(quiet)
    pulse = pulser(ready_fd)
    try:
        load_modules(slot.config.require)
        # A module only this child loaded may have had a callback's copy installed.
        if (installed := installed_for(slot.config)) is not slot.config:
            slot = dataclasses.replace(slot, config=installed)
            runtime = slot.runtime
        # A slot whose registry is empty would fail every job it fetches as
        # unknown: a boot failure, so the parent backs off and gives up.
        require_jobs()
        # Pulses while waiting: the parent counts a child that waits out a
        # Redis outage as present, not as a slot that cannot fill.
        if not wait_or_signal(runtime.pool, signals.reader, signals.writer,
                              lambda n: dispatch(waiting, n) is not None,
                              alive=pulse):
            log.info("child.stopped_while_waiting", slot=slot.name, index=index)
            return EX_OK
    except BaseException as exc:  # noqa: BLE001 - SystemExit from an app module included
        log.error("child.boot_failed", slot=slot.name, index=index,
                  error=f"{type(exc).__name__}: {exc}")
        return EX_BOOT
    # Pulses may come before the ready line, as they did while waiting for
    # Redis: single bytes the parent skips in front of the identity.
    launcher = Launcher(slot.config, runtime=runtime,
                        on_stop_request=lambda: signals.poke(signal.SIGTERM),
                        extra_info={"slot": slot.name, "index": index, "swarm_pid": parent_pid},
                        on_pulse=pulse)
    launcher.start()
    if quiet:
        launcher.quiet()
    _send_ready(ready_fd, launcher.identity)
    # Only after the ready line, so the parent reads the identity first.
    launcher.manager.timer.report_to(overrun.notes_writer(ready_fd))
    keepers = (title_keeper(launcher, slot.name, index),
               OrphanGuard(parent_pid, signals.writer).service)
    for keeper in keepers:
        keeper.start()
    try:
        return serve(signals, worker_signals(launcher, lambda: _stop(launcher)))
    finally:
        for keeper in keepers:
            keeper.stop()


def reset_after_fork(slot: Slot) -> Config:
    """Install the slot's config as this process's default; the config installed.

    The at-fork hook (:mod:`wurk.runtime.forking`) already dropped the parent's
    state; running it again here, after the default changed, keeps the order
    fixed: no socket of the parent's is used once Redis and the client are new.
    """
    config = configure(slot.config)
    close_runtime(config)
    forking.forget_parent_state()
    random.seed()
    wlog.setup(config.log_level, config.log_format)
    return config


def set_parent_death_signal() -> None:
    """Have Linux send us SIGTERM (a drain, not a KILL) when the parent dies."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _own_signals() -> SignalPipe:
    """The child's own wakeup pipe. Never restored: what it replaced is the
    parent's (its wakeup socket among it), and the child leaves by os._exit."""
    return SignalPipe(
        (signal.SIGTERM, signal.SIGTSTP, signal.SIGTTIN),
        # The parent's signals: sent to a child by mistake (or by a whole-group
        # kill) they must not kill it without a drain. Ctrl-C reaches the whole
        # process group; the parent decides what it means.
        ignored=(signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTTOU, signal.SIGINT),
        defaulted=(signal.SIGCHLD,)).install()


def _send_ready(fd: int, identity: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, f"{identity}\n".encode())


def _stop(launcher: Launcher) -> int:
    # A second TERM while draining waits in the pipe, unread: the drain is
    # already under way on this thread, and the child leaves after it.
    stop_before_exit(launcher)
    return EX_OK


def title_keeper(launcher: Launcher, slot_name: str, index: int) -> Service:
    """The process title, kept current (busy of concurrency, or quiet) on a service
    thread; one that fails to set it logs ``child.title_failed`` and tries again."""
    concurrency = launcher.config.concurrency

    def refresh() -> float:
        state = "quiet" if launcher.heartbeat.quiet else "busy"
        busy = launcher.manager.in_flight.busy()
        setproctitle.setproctitle(
            f"wurk-swarm: child {slot_name}#{index} [{busy} of {concurrency} {state}]")
        return TITLE_REFRESH

    return Service("title", refresh, failed=logged(log, "child.title_failed", TITLE_REFRESH))


class OrphanGuard:
    """Backs up PDEATHSIG: a re-parented child notices within ORPHAN_POLL seconds
    and TERMs itself; a check that raises is logged and asked again next poll."""

    def __init__(self, parent_pid: int, writer: socket.socket) -> None:
        self.parent_pid = parent_pid
        self.writer = writer
        self.service = Service("orphan-guard", self._check,
                               failed=logged(log, "child.orphan_check_failed", ORPHAN_POLL))

    def _check(self) -> float:
        if os.getppid() == self.parent_pid:
            return ORPHAN_POLL
        log.warning("child.orphaned", parent_pid=self.parent_pid)
        poke(self.writer, signal.SIGTERM)
        self.service.stop()  # once: the TERM drains and ends the child
        return 0.0

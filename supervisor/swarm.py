"""The swarm: forks one child per topology slot and keeps them running.

Duties:
1. ``boot``: import the shared ``require`` modules in the parent, freeze the
   heap (``gc.freeze``) so children share it copy-on-write, and fork the
   children slot by slot. Drain hooks are registered before the first fork.
2. ``supervise`` (a dedicated thread, which also does every fork, so the
   kernel's parent-death signal stays armed as long as the swarm lives):
   reap children, respawn a dead child in its slot and index with a per-slot
   exponential backoff, give up when a slot's children keep failing to boot
   (exit :data:`EX_BOOT`: the application cannot load; a child waiting for
   an unreachable Redis is not failing), KILL and replace a child that
   stopped pulsing for ``child_timeout`` (``supervisor.liveness``), recycle
   children above ``max_memory_mb``, and carry out the commands the main
   thread hands over (quiet, rolling restart, more/fewer children up to each
   slot's ``max_count``, a status dump, ``supervisor.status``). A reaped
   child's jobs and registration are cleaned up in Redis by
   ``supervisor.reaped``.
3. ``request_shutdown`` (thread-safe, idempotent) asks the supervise thread
   to drain: TERM every child, wait shutdown_timeout + grace, KILL the rest,
   reap all. ``shutdown`` does the same directly when no supervisor runs.
4. Remote control (``supervisor.remote``): beat into ``wurk:swarms`` from the
   supervise loop and carry out the quiet/stop/restart/... an operator sent
   with ``wurk quiet --swarm``; unregister when the drain ends.

The loop reads like its table of contents in :meth:`Swarm._tick`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import queue
import random
import select
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import setproctitle

from supervisor import liveness
from supervisor import status as status_dump
from supervisor.child_boot import EX_BOOT, MANAGED_SIGNALS, run_child
from supervisor.reaped import Reaped
from supervisor.remote import RemoteControl, SwarmSnapshot
from supervisor.systemd import Notifier
from wurk.core import logging as wlog
from wurk.core import pids
from wurk.core.threads import describe
from wurk.redis.pools import close_pool
from wurk.runtime.loading import load_modules

if TYPE_CHECKING:
    from supervisor.topology import Slot, Topology

log = wlog.get_logger("wurk.swarm")
TICK = 0.5
# A child that dies within this many seconds of its birth counts as crash-looping.
CRASH_WINDOW = 10.0
BACKOFF_BASE = 0.5
# The swarm's exit status when a drain had to KILL a child that overran it.
EX_KILLED = 1


@dataclass
class Child:
    slot: Slot
    index: int
    pid: int
    ready_fd: int | None
    born: float = field(default_factory=time.monotonic)
    identity: str | None = None
    # Set once we asked it to leave: the monotonic time after which it is KILLed.
    kill_at: float | None = None
    # Leaving for good (TTOU, replaced in a rolling restart): do not respawn.
    retiring: bool = False
    # Monotonic time of the last byte on the ready pipe (the ready line, then pulses).
    last_pulse: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        return self.identity is not None

    @property
    def label(self) -> str:
        return f"{self.slot.name}#{self.index}"


@dataclass
class SlotState:
    slot: Slot
    wanted: int
    crashes: int = 0
    boot_failures: int = 0
    next_spawn_at: float = 0.0


class Swarm:
    def __init__(self, topology: Topology, *, notifier: Notifier | None = None,
                 hosted: bool = False) -> None:
        self.topology = topology
        # Inside a host (a web server), the process title is the host's.
        self.hosted = hosted
        self.notifier = notifier or Notifier.from_env()
        self.owner_pid = os.getpid()
        self.children: dict[int, Child] = {}
        self.slots = {s.name: SlotState(s, s.count) for s in topology.slots}
        self.exit_code = 0
        self._commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._draining = False
        self._drain_deadline = 0.0
        self._finished = threading.Event()
        self._quiet = False
        self._rolling: list[Child] = []
        # (old, replacement) while a rolling restart waits for the replacement.
        self._rolling_pair: tuple[Child, Child] | None = None
        self._announced_ready = False
        self._booted = False
        self._started = time.monotonic()
        self._next_memory_check = 0.0
        self._next_watchdog = 0.0
        self.supervisor_thread: threading.Thread | None = None
        self._hooks_registered = False
        self._title = ""
        self.reaped = Reaped()
        self.remote = RemoteControl(topology.base, topology.path, self.command)

    # -- ownership and hooks ------------------------------------------------
    def owner(self) -> bool:
        """True only in the process that built the swarm (never in a child)."""
        return os.getpid() == self.owner_pid

    def register_drain_hooks(self) -> None:
        """atexit drain, registered before any fork; a no-op in children."""
        if not self._hooks_registered:
            atexit.register(self._drain_at_exit)
            self._hooks_registered = True

    def _drain_at_exit(self) -> None:
        if not self.owner() or not self.children:
            return
        thread = self.supervisor_thread
        if thread is not None and thread.is_alive():
            self.request_shutdown()
            thread.join(self.topology.shutdown_timeout + self.topology.shutdown_grace + 1)
            if not thread.is_alive():
                return
        else:
            self.shutdown()

    # -- boot -----------------------------------------------------------
    def boot(self) -> None:
        """Preload the app and fork every slot's children (call from the supervise thread)."""
        self.register_drain_hooks()
        load_modules(self.topology.base.require)
        # The parent never works jobs; close what the preload may have opened.
        close_pool(self.topology.base)
        for slot in self.topology.slots:
            close_pool(slot.config)
        for state in self.slots.values():
            for index in range(state.wanted):
                self._spawn(state.slot, index)
        log.info("swarm.forked", children=len(self.children),
                 slots={n: s.wanted for n, s in self.slots.items()})

    def _spawn(self, slot: Slot, index: int) -> Child | None:
        """The new child, or None when the fork failed (logged; the caller backs off)."""
        try:
            ready_r, ready_w = os.pipe()
            pid = self._fork(ready_r, ready_w)
        except OSError as exc:  # out of descriptors, processes or memory: never die of it
            log.error("child.spawn_failed", slot=slot.name, index=index,
                      error=f"{type(exc).__name__}: {exc}")
            return None
        if pid == 0:
            inherited = [self._wake_r, self._wake_w, ready_r,
                         *(c.ready_fd for c in self.children.values() if c.ready_fd is not None)]
            run_child(slot, index, self.owner_pid, ready_w, inherited)
        os.close(ready_w)
        os.set_blocking(ready_r, False)
        child = Child(slot, index, pid, ready_r)
        self.children[pid] = child
        log.info("child.spawned", slot=slot.name, index=index, pid=pid)
        return child

    def _fork(self, ready_r: int, ready_w: int) -> int:
        if self.topology.gc_freeze:
            gc.freeze()
        with warnings.catch_warnings():
            # 3.12+ warns about forking a threaded process; we reset what we own.
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                return os.fork()
            except OSError:
                os.close(ready_r)
                os.close(ready_w)
                raise

    # -- the supervise loop -------------------------------------------------
    def supervise(self) -> int:
        """Boot, then supervise until drained. Returns the swarm's exit status."""
        # Signals go to the main thread (or the host), never to this one; the
        # children forked from here start with them blocked too, so nothing
        # reaches a child before it has its own handlers.
        signal.pthread_sigmask(signal.SIG_BLOCK, MANAGED_SIGNALS)
        try:
            try:
                self.boot()
            except BaseException as exc:  # noqa: BLE001 - even SystemExit from an app module
                # A failed boot drains what it started; leaving this thread
                # instead would leave the main thread waiting for ever.
                log.error("swarm.boot_failed", error=f"{type(exc).__name__}: {exc}")
                self.exit_code = EX_BOOT
                self.request_shutdown()
            while not self._finished.is_set():
                self._wait(TICK)
                self._tick_safely()
        finally:
            self._finished.set()
            self.notifier.close()
        return self.exit_code

    def _tick_safely(self) -> None:
        """One tick; an error of ours in it is logged and the next tick tries
        again, since a dead supervise thread would leave every child unwatched."""
        try:
            self._tick()
        except BaseException as exc:  # noqa: BLE001 - the supervisor outlives its own bugs
            log.error("swarm.tick_failed", error=describe(exc),
                      traceback=traceback.format_exc(limit=8))

    def _tick(self) -> None:
        self._read_ready_pipes()
        self._run_commands()
        self._reap()
        if self.reaped.pending:
            self.reaped.run()
        self._refresh_remote()
        if self._draining:
            self._drain_step()
            return
        self._respawn_missing()
        self._advance_rolling_restart()
        self._check_memory()
        self._kill_overdue()
        self._kill_hung()
        self._report_to_systemd()
        self._update_title()

    def _wait(self, timeout: float) -> None:
        # Ready lines wake the loop; pulses from ready children wait for the next
        # tick. poll, not select: with a pipe per child, descriptors can pass 1024.
        poller = select.poll()
        for fd in [self._wake_r, *(c.ready_fd for c in self.children.values()
                                   if c.ready_fd is not None and not c.ready)]:
            poller.register(fd, select.POLLIN)
        with contextlib.suppress(InterruptedError, OSError):
            if any(fd == self._wake_r for fd, _ in poller.poll(timeout * 1000)):
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    # -- commands from other threads -----------------------------------------
    def request_shutdown(self) -> None:
        """Ask the supervise thread to drain. Thread-safe and idempotent."""
        self._commands.put("shutdown")
        self._wake()

    def command(self, name: str) -> None:
        """Hand over ``quiet``, ``restart``, ``more``, ``fewer`` or ``status``."""
        self._commands.put(name)
        self._wake()

    def _run_commands(self) -> None:
        while True:
            try:
                name = self._commands.get_nowait()
            except queue.Empty:
                return
            handler = getattr(self, f"_cmd_{name}", None)
            if handler is None:
                log.warning("swarm.unknown_command", command=name)
            else:
                handler()

    def _refresh_remote(self) -> None:
        state = "draining" if self._draining else "quiet" if self._quiet else "running"
        children = sorted((c.slot.name, c.index, c.identity) for c in self.children.values()
                          if c.identity is not None)
        self.remote.refresh(SwarmSnapshot(
            slots={name: s.wanted for name, s in self.slots.items()},
            children=[identity for _, _, identity in children], state=state))

    def _cmd_shutdown(self) -> None:
        if self._draining:
            return
        self._draining = True
        self.notifier.notify(STOPPING=1, STATUS="draining")
        self._drain_deadline = (time.monotonic() + self.topology.shutdown_timeout
                                + self.topology.shutdown_grace)
        log.info("swarm.draining", children=len(self.children))
        for child in self.children.values():
            self._signal(child, signal.SIGTERM)

    def _cmd_quiet(self) -> None:
        self._quiet = True
        log.info("swarm.quiet", children=len(self.children))
        for child in self.children.values():
            self._signal(child, signal.SIGTSTP)

    def _cmd_restart(self) -> None:
        if self._rolling or self._rolling_pair:
            log.info("swarm.restart_already_running")
            return
        # A rolling restart is a deploy: the replacements take work again,
        # and so does the swarm as a whole.
        self._quiet = False
        self._rolling = sorted((c for c in self.children.values() if not c.retiring),
                               key=lambda c: (c.slot.name, c.index))
        log.info("swarm.rolling_restart", children=len(self._rolling))

    def _cmd_more(self) -> None:
        for state in self.slots.values():
            if state.wanted >= state.slot.max_count:
                log.warning("swarm.scale_refused", slot=state.slot.name, wanted=state.wanted,
                            max_count=state.slot.max_count)
                continue
            state.wanted += 1
        log.info("swarm.scale", wanted={n: s.wanted for n, s in self.slots.items()})

    def _cmd_fewer(self) -> None:
        for state in self.slots.values():
            if state.wanted <= 1:
                continue
            state.wanted -= 1
            for child in self._live(state.slot.name):
                if child.index >= state.wanted:
                    self._retire(child)
        log.info("swarm.scale", wanted={n: s.wanted for n, s in self.slots.items()})

    def _cmd_status(self) -> None:
        status_dump.log_status(self.children.values(), time.monotonic())

    # -- children's lifecycle ---------------------------------------------
    def _read_ready_pipes(self) -> None:
        """The ready line, then liveness pulses, until the child closes its end."""
        now = time.monotonic()
        for child in list(self.children.values()):
            self._read_pipe(child, now)

    def _read_pipe(self, child: Child, now: float) -> None:
        if child.ready_fd is None:
            return
        data = liveness.read_pipe(child.ready_fd)
        if data is None:
            self._close_ready(child)
            return
        if data:
            child.last_pulse = now
        # Before its ready line a child may pulse too (waiting for Redis).
        line, newline, _ = data.lstrip(liveness.PULSE).partition(b"\n")
        if child.identity is None and newline and line.strip():
            self._mark_ready(child, line)

    def _mark_ready(self, child: Child, line: bytes) -> None:
        child.identity = line.decode(errors="replace").strip()
        self.slots[child.slot.name].boot_failures = 0
        log.info("child.ready", slot=child.slot.name, index=child.index, pid=child.pid,
                 identity=child.identity)
        if not self._booted and all(len([c for c in self._live(n) if c.ready]) >= s.wanted
                                    for n, s in self.slots.items()):
            # Once, when every slot first has all its children ready.
            self._booted = True
            log.info("swarm.booted", ready=sum(c.ready for c in self.children.values()),
                     slots={n: s.wanted for n, s in self.slots.items()},
                     seconds=round(time.monotonic() - self._started, 3))

    def _close_ready(self, child: Child) -> None:
        if child.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(child.ready_fd)
            child.ready_fd = None

    def _reap(self) -> None:
        for pid, status in self._waitpid_all():
            child = self.children.pop(pid, None)
            if child is None:
                log.debug("swarm.reaped_stranger", pid=pid)
                continue
            # Its last words: a ready line written just before it died still
            # makes it a ready child (its jobs recovered, no boot failure).
            self._read_pipe(child, time.monotonic())
            self._close_ready(child)
            self._after_exit(child, os.waitstatus_to_exitcode(status))

    def _waitpid_all(self) -> list[tuple[int, int]]:
        """Exited children. As PID 1 reap anything; otherwise only our own pids,
        so a host process's other children are never stolen."""
        found: list[tuple[int, int]] = []
        targets = [-1] if os.getpid() == 1 else list(self.children)
        for target in targets:
            while True:
                try:
                    pid, status = os.waitpid(target, os.WNOHANG)
                except ChildProcessError:
                    if target != -1 and not pids.alive(target):
                        # Someone else reaped it (a host that waits on every
                        # child); its status is lost, so report it as unknown.
                        found.append((target, UNKNOWN_STATUS))
                    break
                if pid == 0:
                    break
                found.append((pid, status))
                if target != -1:
                    break
        return found

    def _after_exit(self, child: Child, code: int) -> None:
        fields = {"slot": child.slot.name, "index": child.index, "pid": child.pid,
                  "exit": _describe_exit(code)}
        if code == -signal.SIGKILL and child.kill_at is None:
            log.warning("child.killed", hint="SIGKILL we did not send: possibly the OOM killer",
                        **fields)
        else:
            log.info("child.exited", **fields)
        self._forget_rolling(child)
        if child.identity is not None:
            # Its jobs go back now, not when its heartbeat lapses; and it leaves processes.
            self.reaped.add(child.identity, child.slot)
        if self._draining or child.retiring:
            return
        state = self.slots[child.slot.name]
        if not child.ready and code == EX_BOOT:
            self._boot_failed(state, code)
            return
        lived = time.monotonic() - child.born
        # Exit 0 is a clean drain (``wurk stop IDENTITY``): replaced at once, never a crash.
        crashed = code != 0 and lived < CRASH_WINDOW and child.kill_at is None
        state.crashes = state.crashes + 1 if crashed else 0
        self._schedule_respawn(state)

    def _boot_failed(self, state: SlotState, code: int) -> None:
        state.boot_failures += 1
        log.error("child.boot_failed", slot=state.slot.name, exit=code,
                  failures=state.boot_failures, limit=self.topology.boot_failure_limit)
        if state.boot_failures >= self.topology.boot_failure_limit:
            log.error("swarm.giving_up", slot=state.slot.name,
                      reason="children keep dying before they become ready")
            self.exit_code = EX_BOOT
            self._cmd_shutdown()
            return
        state.crashes += 1
        self._schedule_respawn(state)

    def _schedule_respawn(self, state: SlotState) -> None:
        delay = 0.0
        if state.crashes:
            delay = min(self.topology.respawn_backoff_max,
                        BACKOFF_BASE * 2 ** (state.crashes - 1))
            log.warning("slot.backoff", slot=state.slot.name, crashes=state.crashes,
                        delay=round(delay, 2))
        state.next_spawn_at = time.monotonic() + delay

    def _live(self, slot_name: str) -> list[Child]:
        return [c for c in self.children.values() if c.slot.name == slot_name and not c.retiring]

    def _respawn_missing(self) -> None:
        if self._quiet:
            return
        now = time.monotonic()
        for name, state in self.slots.items():
            if now < state.next_spawn_at:
                continue
            taken = {c.index for c in self._live(name)}
            for index in range(state.wanted):
                if index not in taken and self._spawn(state.slot, index) is None:
                    state.crashes += 1
                    self._schedule_respawn(state)
                    break

    def _retire(self, child: Child) -> None:
        child.retiring = True
        self._stop_child(child)

    def _stop_child(self, child: Child) -> None:
        if child.kill_at is None:
            child.kill_at = (time.monotonic() + child.slot.config.shutdown_timeout
                             + self.topology.shutdown_grace)
            self._signal(child, signal.SIGTERM)

    def _kill_hung(self) -> None:
        now = time.monotonic()
        for child in liveness.hung(self.children.values(), now):
            log.error("child.hung", slot=child.slot.name, index=child.index, pid=child.pid,
                      silent=round(liveness.silent_for(child, now), 1),
                      child_timeout=child.slot.child_timeout)
            self._signal(child, signal.SIGKILL)
            child.kill_at = float("inf")

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for child in self.children.values():
            if child.kill_at is not None and now >= child.kill_at:
                log.warning("child.kill", slot=child.slot.name, index=child.index,
                            pid=child.pid, reason="drain timed out")
                self._signal(child, signal.SIGKILL)
                child.kill_at = float("inf")

    # -- rolling restart -------------------------------------------------------
    def _advance_rolling_restart(self) -> None:
        """Fork a replacement, wait until it is ready, then let the old one drain."""
        if self._rolling_pair is not None:
            old, new = self._rolling_pair
            if not new.ready:
                return
            self._stop_child(old)
            self._rolling_pair = None
        while self._rolling:
            old = self._rolling.pop(0)
            if old.pid not in self.children or old.retiring:
                continue
            replacement = self._spawn(old.slot, old.index)
            if replacement is None:
                self._rolling.clear()
                log.error("swarm.rolling_restart_aborted", slot=old.slot.name, index=old.index)
                return
            old.retiring = True  # the replacement takes over its index
            self._rolling_pair = (old, replacement)
            return

    def _forget_rolling(self, child: Child) -> None:
        if self._rolling_pair is None or child not in self._rolling_pair:
            return
        old, new = self._rolling_pair
        self._rolling_pair = None
        if child is new and old.pid in self.children and new.retiring:
            # TTOU retired the replacement's index: the old child leaves too.
            self._stop_child(old)
        elif child is new and old.pid in self.children:
            # The replacement died before it was ready: keep the old child.
            old.retiring = False
            self._rolling.clear()
            log.error("swarm.rolling_restart_aborted", slot=old.slot.name, index=old.index)

    # -- memory -----------------------------------------------------------
    def _check_memory(self) -> None:
        now = time.monotonic()
        if now < self._next_memory_check:
            return
        interval = self.topology.memory_check_interval
        self._next_memory_check = now + interval * random.uniform(0.8, 1.2)
        over = [c for c in self.children.values()
                if c.ready and not c.retiring and c.kill_at is None and c.slot.max_memory_mb
                and status_dump.rss_kb(c.pid) > c.slot.max_memory_mb * 1024]
        if over:
            # One per check, picked at random, so children do not recycle together.
            child = random.choice(over)
            log.warning("child.memory_exceeded", slot=child.slot.name, index=child.index,
                        pid=child.pid, rss_kb=status_dump.rss_kb(child.pid),
                        limit_mb=child.slot.max_memory_mb)
            self._stop_child(child)

    # -- drain ----------------------------------------------------------
    def _drain_step(self) -> None:
        if not self.children:
            self.remote.unregister()
            self._finished.set()
            log.info("swarm.drained", exit_code=self.exit_code)
            return
        if time.monotonic() >= self._drain_deadline:
            for child in self.children.values():
                if child.kill_at != float("inf"):
                    log.warning("child.kill", slot=child.slot.name, index=child.index,
                                pid=child.pid, reason="swarm drain timed out")
                    self._signal(child, signal.SIGKILL)
                    child.kill_at = float("inf")
            self.exit_code = self.exit_code or EX_KILLED

    def shutdown(self) -> int:
        """Drain directly on this thread (for when no supervise thread runs)."""
        self._cmd_shutdown()
        while self.children:
            self._wait(0.1)
            self._reap()
            self._drain_step()
        self._finished.set()
        return self.exit_code

    def wait_finished(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    # -- systemd ---------------------------------------------------------
    def _report_to_systemd(self) -> None:
        if not self.notifier.enabled:
            return
        now = time.monotonic()
        all_ready = all(
            len([c for c in self._live(n) if c.ready]) >= s.wanted for n, s in self.slots.items())
        if all_ready and not self._announced_ready:
            self._announced_ready = True
            self.notifier.notify(READY=1, STATUS=self._status_line())
        interval = self.notifier.watchdog_interval()
        # Judged by pulses, not by beats in Redis: a Redis outage must not get
        # the whole swarm restarted by systemd, nor must a replacement child
        # that waits it out (it pulses while it waits).
        full = all(len([c for c in self._live(n) if liveness.present(c, now)]) >= s.wanted
                   for n, s in self.slots.items())
        fresh = liveness.all_fresh([c for c in self.children.values() if not c.retiring], now)
        if interval and self._announced_ready and full and fresh \
                and now >= self._next_watchdog:
            self._next_watchdog = now + interval
            self.notifier.notify(WATCHDOG=1, STATUS=self._status_line())

    def _update_title(self) -> None:
        if self.hosted:
            return
        state = "quiet" if self._quiet else "draining" if self._draining else "running"
        title = f"wurk-swarm: parent {state} [{self._status_line()}]"
        if title != self._title:
            self._title = title
            setproctitle.setproctitle(title)

    def _status_line(self) -> str:
        return ", ".join(f"{n}: {len(self._live(n))}/{s.wanted}" for n, s in self.slots.items())

    # -- helpers -----------------------------------------------------------
    def _signal(self, child: Child, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signum)


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # e.g. SIGRTMIN+3, which has no Signals member
        return f"signal {-code}"


# What a child reaped by someone else is reported as: "exited 255".
UNKNOWN_STATUS = 255 << 8


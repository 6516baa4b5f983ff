"""The swarm: forks one child per topology slot and index and keeps them running.

Duties:
1. ``boot``: import the shared ``require`` modules in the parent and fork the
   children slot by slot (``supervisor.processes``). Drain hooks are
   registered before the first fork. Then, if periodic entries exist, the
   parent's periodic loop (``supervisor.periodic``); a drain stops it.
2. ``supervise``, on a thread of its own that also does every fork (so the
   kernel's parent-death signal stays armed as long as the swarm lives):
   tick until drained. :meth:`Swarm._tick` is the table of contents.
3. Restarts: a reaped child's jobs and registration are cleaned up in Redis
   (``supervisor.reaped``) and it is respawned in its slot and index, with a
   per-slot backoff while children crash; the swarm gives up (exit
   :data:`EX_BOOT`) when a slot's children keep failing to boot
   (``supervisor.children``). A child silent for ``child_timeout``
   (``supervisor.liveness``) or above ``max_memory_mb``
   (``supervisor.memory``) is replaced.
4. Commands, from the main thread's signals (``supervisor.cli``) or an
   operator through Redis (``supervisor.remote``): quiet, rolling restart
   (``supervisor.rolling``), more or fewer children (in every slot, or in
   one: ``more:<slot>``) up to each slot's ``max_count``, a status dump
   (``supervisor.status``).
5. Drain (``request_shutdown``, thread-safe and idempotent): TERM every
   child, KILL what is left after shutdown_timeout + grace (exit
   :data:`EX_KILLED`), reap all, unregister. ``shutdown`` drains directly
   when no supervise thread runs.
6. Report: beat into ``wurk:swarms``, feed systemd (``supervisor.watchdog``),
   keep the process title current.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import select
import signal
import threading
import time
import traceback
from typing import TYPE_CHECKING

from supervisor import evidence, liveness, overrun, periodic, processes, status
from supervisor.child_boot import MANAGED_SIGNALS
from supervisor.children import Child, SlotState, all_ready, beyond_wanted, ready_fds, wanted
from supervisor.exits import EX_BOOT
from supervisor.memory import MemoryCheck, rss_kb
from supervisor.reaped import Reaped
from supervisor.remote import RemoteControl
from supervisor.rolling import RollingRestart
from supervisor.systemd import Notifier
from supervisor.watchdog import Watchdog
from wurk.core import logging as wlog
from wurk.core.threads import describe
from wurk.runtime.loading import load_modules

if TYPE_CHECKING:
    from supervisor.topology import Slot, Topology
    from wurk.runtime.periodic import PeriodicLoop

__all__ = ["EX_KILLED", "Child", "SlotState", "Swarm"]

log = wlog.get_logger("wurk.swarm")
TICK = 0.5
# The swarm's exit status when a drain had to KILL a child that overran it.
EX_KILLED = 1


class Swarm:
    """The supervisor of one swarm: its children, their slots, and the loop that keeps them.

    ``children`` (pid -> Child) and ``slots`` (name -> SlotState) are the
    children table; ``exit_code`` is the swarm's exit status once drained.
    Only the supervise thread changes them; other threads reach it through
    :meth:`command` and :meth:`request_shutdown` (a queue and a wake-up
    pipe), and the loop acts on the next tick.
    """

    def __init__(self, topology: Topology, *, notifier: Notifier | None = None,
                 hosted: bool = False) -> None:
        self.topology = topology
        self.notifier = notifier or Notifier.from_env()
        self.owner_pid = os.getpid()
        self.children: dict[int, Child] = {}
        self.slots = {s.name: SlotState(s, s.count) for s in topology.slots}
        self.exit_code = 0
        # The thread start_supervising runs, and what its supervise returned.
        self.supervisor_thread: threading.Thread | None = None
        self.supervised: int | None = None
        self.reaped = Reaped()
        self.remote = RemoteControl(topology.base, topology.path, self.command)
        self.rolling = RollingRestart(topology.shutdown_grace)
        self.memory = MemoryCheck(topology.memory_check_interval)
        self.watchdog = Watchdog(self.notifier)
        # Inside a host (a web server), the process title is the host's.
        self.title = status.Title(hosted)
        self._commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._quiet = False
        self._draining = False
        self._drain_deadline = 0.0
        self._finished = threading.Event()
        self._booted = False
        self._started = time.monotonic()
        self._hooks_registered = False
        self.periodic: PeriodicLoop | None = None

    # -- lifecycle: what the main thread or a host calls -----------------------
    def boot(self) -> None:
        """Preload the app and fork every slot's children (call from the supervise thread)."""
        self.register_drain_hooks()
        load_modules(self.topology.base.require)
        # The parent never works jobs; close what the preload may have opened.
        self.remote.runtime.close()  # the base config's, as the preload may have used it
        for slot in self.topology.slots:
            slot.runtime.close()
        for state in self.slots.values():
            for index in range(state.wanted):
                self._spawn(state.slot, index)
        log.info("swarm.forked", children=len(self.children), slots=wanted(self.slots))
        # After the first forks: the parent, never a child, competes for ticks.
        self.periodic = periodic.start(self.topology)

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

    def start_supervising(self, *, daemon: bool) -> threading.Thread:
        """Run :meth:`supervise` on a thread of its own: the one a drain at exit waits for."""
        def run() -> None:
            self.supervised = self.supervise()
        self.supervisor_thread = threading.Thread(target=run, name="wurk-supervise",
                                                  daemon=daemon)
        self.supervisor_thread.start()
        return self.supervisor_thread

    def command(self, name: str) -> None:
        """Hand over ``quiet``, ``restart``, ``more``, ``fewer`` or ``status``."""
        self._commands.put(name)
        self._wake()

    def request_shutdown(self) -> None:
        """Ask the supervise thread to drain. Thread-safe and idempotent."""
        self.command("shutdown")

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

    def owner(self) -> bool:
        """True only in the process that built the swarm (never in a child)."""
        return os.getpid() == self.owner_pid

    def register_drain_hooks(self) -> None:
        """atexit drain, registered before any fork; a no-op in children."""
        if not self._hooks_registered:
            atexit.register(self._drain_at_exit)
            self._hooks_registered = True

    # -- the supervise loop ----------------------------------------------------
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
        self.remote.refresh(status.snapshot(self.children.values(), self.slots, self._state()))
        if self._draining:
            self._drain_step()
            return
        self._respawn_missing()
        self.rolling.advance(self.children, self._spawn)
        if recycled := self.memory.over_limit(self.children.values(), time.monotonic()):
            # Before the TERM, so the jobs its drain gives back carry the evidence.
            self.reaped.accuse(recycled, evidence.over_memory(
                rss_kb(recycled.pid), recycled.slot.max_memory_mb))
            processes.stop(recycled, self.topology.shutdown_grace)
        processes.kill_overdue(self.children.values(), time.monotonic())
        processes.kill_hung(self.children.values(), time.monotonic())
        alive = [c for c in self.children.values() if c.kill_at != processes.KILLED]
        for child in overrun.overran(alive, time.monotonic()):
            processes.kill(child)
        self.watchdog.report(self.children, self.slots, time.monotonic())
        self.title.show(self._state(), self.children, self.slots)

    def _wait(self, timeout: float) -> None:
        # Ready lines wake the loop; pulses from ready children wait for the next
        # tick. poll, not select: with a pipe per child, descriptors can pass 1024.
        poller = select.poll()
        for fd in [self._wake_r, *ready_fds(c for c in self.children.values() if not c.ready)]:
            poller.register(fd, select.POLLIN)
        with contextlib.suppress(InterruptedError, OSError):
            if any(fd == self._wake_r for fd, _ in poller.poll(timeout * 1000)):
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def _state(self) -> str:
        return "draining" if self._draining else "quiet" if self._quiet else "running"

    def _run_commands(self) -> None:
        while True:
            try:
                name = self._commands.get_nowait()
            except queue.Empty:
                return
            verb, _, slot = name.partition(":")  # more:<slot>, fewer:<slot>: one slot only
            handler = getattr(self, f"_cmd_{verb}", None)
            if handler is None or (slot and verb not in ("more", "fewer")):
                log.warning("swarm.unknown_command", command=name)
            elif slot:
                handler(slot)
            else:
                handler()

    # -- commands --------------------------------------------------------------
    def _cmd_shutdown(self) -> None:
        if self._draining:
            return
        self._draining = True
        periodic.stop_soon(self.periodic)
        self.watchdog.stopping()
        self._drain_deadline = (time.monotonic() + self.topology.shutdown_timeout
                                + self.topology.shutdown_grace)
        log.info("swarm.draining", children=len(self.children))
        for child in self.children.values():
            processes.signal_child(child, signal.SIGTERM)

    def _cmd_quiet(self) -> None:
        self._quiet = True
        log.info("swarm.quiet", children=len(self.children))
        for child in self.children.values():
            processes.signal_child(child, signal.SIGTSTP)

    def _cmd_restart(self) -> None:
        if self.rolling.running:
            log.info("swarm.restart_already_running")
            return
        # A rolling restart is a deploy: the replacements take work again,
        # and so does the swarm as a whole.
        self._quiet = False
        log.info("swarm.rolling_restart", children=self.rolling.start(self.children.values()))

    def _cmd_more(self, slot: str = "") -> None:
        for state in self._chosen(slot).values():
            state.grow()
        log.info("swarm.scale", wanted=wanted(self.slots))

    def _cmd_fewer(self, slot: str = "") -> None:
        for child in beyond_wanted(self._chosen(slot), self.children):
            child.retiring = True
            processes.stop(child, self.topology.shutdown_grace)
        log.info("swarm.scale", wanted=wanted(self.slots))

    def _chosen(self, slot: str) -> dict[str, SlotState]:
        """Every slot, or the one named (none, logged, when there is no such slot)."""
        if not slot:
            return self.slots
        if slot not in self.slots:
            log.warning("swarm.unknown_slot", slot=slot[:200])
            return {}
        return {slot: self.slots[slot]}

    def _cmd_status(self) -> None:
        status.log_status(self.children.values(), time.monotonic())

    # -- children --------------------------------------------------------------
    def _spawn(self, slot: Slot, index: int) -> Child | None:
        """Fork into the table; None when the fork failed (logged; the caller backs off)."""
        child = processes.spawn(
            slot, index, owner_pid=self.owner_pid, gc_freeze=self.topology.gc_freeze,
            inherited=[self._wake_r, self._wake_w, *ready_fds(self.children.values())])
        if child is not None:
            self.children[child.pid] = child
        return child

    def _read_ready_pipes(self) -> None:
        """The ready line, then liveness pulses, until the child closes its end."""
        now = time.monotonic()
        for child in list(self.children.values()):
            self._read_pipe(child, now)

    def _read_pipe(self, child: Child, now: float) -> None:
        identity = liveness.read_child(child, now)
        if identity is None:
            return
        child.identity = identity
        self.slots[child.slot.name].boot_failures = 0
        log.info("child.ready", **child.fields, identity=identity)
        if not self._booted and all_ready(self.children, self.slots):
            self._booted = True  # once, when every slot first has all its children ready
            status.log_booted(self.children.values(), self.slots,
                              time.monotonic() - self._started)

    def _reap(self) -> None:
        for pid, wait_status in processes.exited(self.children):
            child = self.children.pop(pid, None)
            if child is None:
                log.debug("swarm.reaped_stranger", pid=pid)
                continue
            # Its last words: a ready line written just before it died still
            # makes it a ready child (its jobs recovered, no boot failure).
            self._read_pipe(child, time.monotonic())
            liveness.close_pipe(child)
            self._after_exit(child, wait_status)

    def _after_exit(self, child: Child, wait_status: int) -> None:
        code = os.waitstatus_to_exitcode(wait_status)
        processes.log_exit(child, code)
        self.rolling.forget(child, self.children)
        if child.identity is not None:
            # Its jobs go back now, not when its heartbeat lapses; and it leaves processes.
            self.reaped.add(child.identity, child.slot, child.overran,
                            evidence.classify(wait_status))
        if self._draining or child.retiring:
            return
        if not self.slots[child.slot.name].count_exit(
                child, code, boot_failure_limit=self.topology.boot_failure_limit,
                backoff_max=self.topology.respawn_backoff_max):
            self.exit_code = EX_BOOT
            self._cmd_shutdown()

    def _respawn_missing(self) -> None:
        if self._quiet:
            return
        now = time.monotonic()
        for state in self.slots.values():
            for index in state.missing(self.children, now):
                if self._spawn(state.slot, index) is None:
                    state.spawn_failed(self.topology.respawn_backoff_max)
                    break

    # -- drain -----------------------------------------------------------------
    def _drain_step(self) -> None:
        if not self.children:
            self.remote.unregister()
            self._finished.set()
            log.info("swarm.drained", exit_code=self.exit_code)
            return
        if time.monotonic() >= self._drain_deadline:
            processes.kill_all(self.children.values())
            self.exit_code = self.exit_code or EX_KILLED

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

"""The children table: which child serves which slot and index, and how each slot fares.

The swarm keeps ``children`` (pid -> :class:`Child`) and ``slots`` (name ->
:class:`SlotState`) as plain dicts; this module holds their types and the
questions and changes the supervise loop puts to them.

Duties:
1. :class:`Child`: a forked child's slot, index, pid, ready pipe, birth,
   identity once ready, the moment it is KILLed if it has not left, whether
   it is retiring, and its last liveness pulse.
2. :class:`SlotState`: a slot's wanted count (TTIN and TTOU move it within
   ``1..max_count``) and its restart record. ``count_exit`` judges a child's
   exit: one that dies before it is ready with :data:`EX_BOOT` counts toward
   ``boot_failure_limit`` (and raises the backoff), one that dies within :data:`CRASH_WINDOW` of its
   birth raises the backoff (:data:`BACKOFF_BASE` doubling up to
   ``respawn_backoff_max``), anything else respawns at once.
3. Questions: the live children of a slot, whether every slot is full of
   ready children, which indexes a slot is missing, which children TTOU
   leaves beyond their slot's count.

Forking, signalling and reaping the processes is ``supervisor.processes``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from supervisor.exits import EX_BOOT
from wurk.core import logging as wlog
from wurk.core.backoff import Backoff

if TYPE_CHECKING:
    from supervisor.topology import Slot

log = wlog.get_logger("wurk.swarm")
# A child that dies within this many seconds of its birth counts as crash-looping.
CRASH_WINDOW = 10.0
BACKOFF_BASE = 0.5


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
    # Hard deadlines of its running jobs (jid -> (queue, monotonic time)), and
    # the jobs it was KILLed for overrunning (jid -> queue): supervisor.overrun.
    deadlines: dict[str, tuple[str, float]] = field(default_factory=dict)
    overran: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.identity is not None

    @property
    def label(self) -> str:
        return f"{self.slot.name}#{self.index}"

    @property
    def fields(self) -> dict[str, Any]:
        """What every log line about this child starts with."""
        return {"slot": self.slot.name, "index": self.index, "pid": self.pid}


@dataclass
class SlotState:
    slot: Slot
    wanted: int
    crashes: int = 0
    boot_failures: int = 0
    next_spawn_at: float = 0.0
    # Per index, the children that exited there and were to be replaced.
    restarts: dict[int, int] = field(default_factory=dict)

    def grow(self) -> None:
        """One more child (TTIN), unless the slot is at its max_count."""
        if self.wanted >= self.slot.max_count:
            log.warning("swarm.scale_refused", slot=self.slot.name, wanted=self.wanted,
                        max_count=self.slot.max_count)
            return
        self.wanted += 1

    def shrink(self) -> bool:
        """One fewer child (TTOU), never below one; False when already at one."""
        if self.wanted <= 1:
            return False
        self.wanted -= 1
        return True

    def missing(self, children: Mapping[int, Child], now: float) -> list[int]:
        """The indexes to fork now: none while the slot's backoff lasts."""
        if now < self.next_spawn_at:
            return []
        taken = {c.index for c in live(children, self.slot.name)}
        return [index for index in range(self.wanted) if index not in taken]

    def count_exit(self, child: Child, code: int, *, boot_failure_limit: int,
                   backoff_max: float) -> bool:
        """Judge a child's exit and schedule its respawn; False when the slot gives up."""
        self.restarts[child.index] = self.restarts.get(child.index, 0) + 1
        if not child.ready and code == EX_BOOT:
            self.boot_failures += 1
            log.error("child.boot_failed", slot=self.slot.name, exit=code,
                      failures=self.boot_failures, limit=boot_failure_limit)
            if self.boot_failures >= boot_failure_limit:
                log.error("swarm.giving_up", slot=self.slot.name,
                          reason="children keep dying before they become ready")
                return False
            self.crashes += 1
        else:
            lived = time.monotonic() - child.born
            # Exit 0 is a clean drain (``wurk stop IDENTITY``): replaced at once, never a crash.
            crashed = code != 0 and lived < CRASH_WINDOW and child.kill_at is None
            self.crashes = self.crashes + 1 if crashed else 0
        self.schedule_respawn(backoff_max)
        return True

    def spawn_failed(self, backoff_max: float) -> None:
        self.crashes += 1
        self.schedule_respawn(backoff_max)

    def schedule_respawn(self, backoff_max: float) -> None:
        delay = 0.0
        if self.crashes:
            # Unjittered: docs/how-to/swarm.md promises 0.5 s, 1 s, 2 s, ...
            delay = Backoff(first=BACKOFF_BASE, cap=backoff_max).delay(self.crashes)
            log.warning("slot.backoff", slot=self.slot.name, crashes=self.crashes,
                        delay=round(delay, 2))
        self.next_spawn_at = time.monotonic() + delay


# -- questions ---------------------------------------------------------------------

def live(children: Mapping[int, Child], slot_name: str) -> list[Child]:
    """The slot's children that are staying (not retiring)."""
    return [c for c in children.values() if c.slot.name == slot_name and not c.retiring]


def all_ready(children: Mapping[int, Child], slots: Mapping[str, SlotState]) -> bool:
    """Every slot has at least its wanted count of live, ready children."""
    return all(len([c for c in live(children, n) if c.ready]) >= s.wanted
               for n, s in slots.items())


def ready_fds(children: Iterable[Child]) -> list[int]:
    return [c.ready_fd for c in children if c.ready_fd is not None]


def wanted(slots: Mapping[str, SlotState]) -> dict[str, int]:
    return {name: s.wanted for name, s in slots.items()}


def beyond_wanted(slots: Mapping[str, SlotState], children: Mapping[int, Child]) -> list[Child]:
    """TTOU: each slot wants one fewer (never below one); the children whose
    index is now past their slot's count, to retire."""
    leaving: list[Child] = []
    for state in slots.values():
        if state.shrink():
            leaving += [c for c in live(children, state.slot.name) if c.index >= state.wanted]
    return leaving

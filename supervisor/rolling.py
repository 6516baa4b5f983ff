"""Rolling restart (HUP, USR1, ``wurk restart --swarm``): every child replaced, one at a time.

Each child in turn gets a replacement forked into its slot and index first;
only once the replacement is ready is the old child asked to drain, so the
swarm never runs short of a child that takes work.

Duties:
1. ``start``: queue every child that is staying, in slot and index order
   (refused while a restart is under way).
2. ``advance`` (every supervise tick): when the pending replacement is
   ready, stop the child it replaces; then fork the next replacement. A
   fork that fails aborts the restart (the old child keeps its index).
3. ``forget`` (for every reaped child): a replacement that died before it
   was ready aborts the restart and keeps the old child; a replacement
   retired by TTOU takes the old child with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from supervisor.children import Child
from supervisor.processes import stop
from wurk.core import logging as wlog

if TYPE_CHECKING:
    from supervisor.topology import Slot

log = wlog.get_logger("wurk.swarm")
Spawn = Callable[["Slot", int], Child | None]


class RollingRestart:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.queue: list[Child] = []
        # (old, replacement) while the restart waits for the replacement.
        self.pair: tuple[Child, Child] | None = None

    @property
    def running(self) -> bool:
        return bool(self.queue or self.pair)

    def start(self, children: Iterable[Child]) -> int:
        """Queue the staying children; how many."""
        self.queue = sorted((c for c in children if not c.retiring),
                            key=lambda c: (c.slot.name, c.index))
        return len(self.queue)

    def advance(self, children: Mapping[int, Child], spawn: Spawn) -> None:
        """Fork a replacement, wait until it is ready, then let the old one drain."""
        if self.pair is not None:
            old, new = self.pair
            if not new.ready:
                return
            stop(old, self.grace)
            self.pair = None
        while self.queue:
            old = self.queue.pop(0)
            if old.pid not in children or old.retiring:
                continue
            replacement = spawn(old.slot, old.index)
            if replacement is None:
                self._abort(old)
                return
            old.retiring = True  # the replacement takes over its index
            self.pair = (old, replacement)
            return

    def forget(self, child: Child, children: Mapping[int, Child]) -> None:
        """``child`` was reaped: settle the pair it belonged to, if any."""
        if self.pair is None or child not in self.pair:
            return
        old, new = self.pair
        self.pair = None
        if child is new and old.pid in children and new.retiring:
            # TTOU retired the replacement's index: the old child leaves too.
            stop(old, self.grace)
        elif child is new and old.pid in children:
            # The replacement died before it was ready: keep the old child.
            old.retiring = False
            self._abort(old)

    def _abort(self, old: Child) -> None:
        self.queue.clear()
        log.error("swarm.rolling_restart_aborted", slot=old.slot.name, index=old.index)

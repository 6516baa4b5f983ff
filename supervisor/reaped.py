"""What the parent does in Redis for a child it has reaped.

The child is dead and holds nothing any more, but Redis may still say
otherwise: its private lists keep the jobs it claimed, and a child that did
not exit cleanly (KILLed as hung, by the OOM killer, a crash) is still a
member of ``processes`` with a heartbeat hash that ages until it expires.
Left there, the jobs wait for some reaper's sweep and ``--probe`` sees a
stale child of the swarm for up to a minute.

Duties:
1. ``add`` a reaped child's identity (only children that became ready have one).
2. ``run`` (every supervise tick while anything is pending): recover the
   child's private lists when its slot uses reliable fetch (a clean exit
   already released them, and this finds them empty), with the cause its
   wait status shows (``supervisor.evidence``), after settling any job it
   was KILLed for overrunning (``supervisor.overrun``; the others it held
   are then not blamed), then forget it: leave ``processes`` and delete its
   heartbeat hash, work hashes and signal list.
3. One try per identity per tick with no replays, so a Redis outage cannot
   stall supervision; what fails is tried again next tick (recovering or
   forgetting twice moves or deletes nothing twice).
4. ``accuse``: a child the parent recycles for its memory is evidence
   against the jobs it runs then (``wurk.runtime.reaper.accuse``), one try.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisor.overrun import settle_overran
from wurk.core import logging as wlog
from wurk.runtime.reaper import NO_EVIDENCE, Cause, accuse, recover
from wurk.wire import keys

if TYPE_CHECKING:
    from supervisor.children import Child
    from supervisor.topology import Slot

log = wlog.get_logger("wurk.swarm")


class Reaped:
    def __init__(self) -> None:
        # Identities still to be recovered and forgotten, with their slot.
        self.pending: dict[str, Slot] = {}
        # Jobs (jid -> queue) a child was KILLed for overrunning: settled first.
        self.overran: dict[str, dict[str, str]] = {}
        # Why each died, as its wait status shows (supervisor.evidence).
        self.causes: dict[str, Cause] = {}

    def add(self, identity: str, slot: Slot, overran: dict[str, str] | None = None,
            cause: Cause = NO_EVIDENCE) -> None:
        self.pending[identity] = slot
        self.causes[identity] = cause
        if overran:
            self.overran[identity] = dict(overran)
        self.run()

    def accuse(self, child: Child, detail: str) -> None:
        """Evidence against the jobs a child runs now; a Redis error only loses it."""
        if child.identity is None or not child.slot.config.reliable_fetch:
            return
        try:
            accuse(child.slot.runtime, child.identity, detail, attempts=1)
        except Exception as exc:  # noqa: BLE001 - the recycle goes on, unaccused
            log.warning("child.accuse_failed", **child.fields, error=f"{type(exc).__name__}: {exc}")

    def run(self) -> None:
        for identity, slot in list(self.pending.items()):
            try:
                overran = self.overran.get(identity)
                if overran:
                    settle_overran(slot.runtime, identity, overran)
                if slot.config.reliable_fetch:
                    # With the culprit known (and KILLed by us), the others are not blamed.
                    cause = NO_EVIDENCE if overran else self.causes.get(identity, NO_EVIDENCE)
                    recover(slot.runtime, identity, attempts=1, cause=cause)
                forget(slot, identity)
            except Exception as exc:  # noqa: BLE001 - Redis trouble: try again next tick
                log.warning("child.recover_failed", slot=slot.name, identity=identity,
                            error=f"{type(exc).__name__}: {exc}")
                return
            del self.pending[identity]
            self.overran.pop(identity, None)
            self.causes.pop(identity, None)


def forget(slot: Slot, identity: str) -> None:
    """The dead child leaves ``processes`` and its hashes go, as a clean exit would do."""
    slot.runtime.pool.pipeline(
        [("SREM", keys.PROCESSES, identity),
         ("UNLINK", identity, keys.work_6_4(identity), keys.work(identity),
          keys.signals(identity))],
        idempotent=True, attempts=1)

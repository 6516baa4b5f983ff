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
   already released them, and this finds them empty), after settling any
   job it was KILLed for overrunning (``supervisor.overrun``), then forget it:
   leave ``processes`` and delete its heartbeat hash, work hashes and
   signal list.
3. One try per identity per tick with no replays, so a Redis outage cannot
   stall supervision; what fails is tried again next tick (recovering or
   forgetting twice moves or deletes nothing twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisor.overrun import settle_overran
from wurk.core import logging as wlog
from wurk.redis.pools import pool_for
from wurk.runtime.reaper import recover
from wurk.wire import keys

if TYPE_CHECKING:
    from supervisor.topology import Slot

log = wlog.get_logger("wurk.swarm")


class Reaped:
    def __init__(self) -> None:
        # Identities still to be recovered and forgotten, with their slot.
        self.pending: dict[str, Slot] = {}
        # Jobs (jid -> queue) a child was KILLed for overrunning: settled first.
        self.overran: dict[str, dict[str, str]] = {}

    def add(self, identity: str, slot: Slot, overran: dict[str, str] | None = None) -> None:
        self.pending[identity] = slot
        if overran:
            self.overran[identity] = dict(overran)
        self.run()

    def run(self) -> None:
        for identity, slot in list(self.pending.items()):
            try:
                overran = self.overran.get(identity)
                if overran:
                    settle_overran(slot.config, identity, overran)
                if slot.config.reliable_fetch:
                    # With the culprit known, the others it held are not blamed.
                    recover(slot.config, identity, attempts=1, died=not overran)
                forget(slot, identity)
            except Exception as exc:  # noqa: BLE001 - Redis trouble: try again next tick
                log.warning("child.recover_failed", slot=slot.name, identity=identity,
                            error=f"{type(exc).__name__}: {exc}")
                return
            del self.pending[identity]
            self.overran.pop(identity, None)


def forget(slot: Slot, identity: str) -> None:
    """The dead child leaves ``processes`` and its hashes go, as a clean exit would do."""
    pool_for(slot.config).pipeline(
        [("SREM", keys.PROCESSES, identity),
         ("UNLINK", identity, keys.work_6_4(identity), keys.work(identity),
          keys.signals(identity))],
        idempotent=True, attempts=1)

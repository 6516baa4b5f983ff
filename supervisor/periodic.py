"""The swarm parent's periodic loop: the one competitor for periodic ticks per swarm.

Duties:
1. ``start``: when the topology's ``[[periodic]]`` entries or the entries
   the ``require`` modules declared with ``wurk.periodic(...)`` are not
   empty, run one :class:`wurk.runtime.periodic.PeriodicLoop` in the parent
   on the ``[wurk]`` config. Children never run one.
2. ``stop_soon``: stop it on a thread of its own, so the drain signals the
   children at once while the loop gives up its lease.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from wurk.push.periodic import merged, table
from wurk.runtime.periodic import PeriodicLoop

if TYPE_CHECKING:
    from supervisor.topology import Topology


def start(topology: Topology) -> PeriodicLoop | None:
    entries = merged(topology.periodic, table.entries())
    if not entries:
        return None
    return PeriodicLoop(topology.base, entries).start()


def stop_soon(loop: PeriodicLoop | None) -> None:
    if loop is not None:
        threading.Thread(target=loop.stop, name="wurk-periodic-stop", daemon=True).start()

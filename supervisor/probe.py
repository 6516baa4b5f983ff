"""``wurk-swarm --probe``: is the swarm on this host alive and working?

For exec probes (Kubernetes liveness/readiness, scripts). It reads the
heartbeats in Redis (each slot's own Redis) and passes when every slot has
at least one child that beat recently and belongs to the swarm with the
given parent pid (PID 1 inside a container, where the swarm parent is the
container's init). At least one per slot, not the topology's count: TTIN
and TTOU change the count at run time, and a child being replaced is
briefly missing.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

from supervisor.topology import Slot, Topology
from wurk import keys

# A beat older than this many heartbeat intervals counts as stale.
STALE_BEATS = 3


@dataclass(frozen=True)
class ProbeResult:
    fresh: dict[str, int]

    @property
    def ok(self) -> bool:
        return all(count > 0 for count in self.fresh.values())


def probe(topology: Topology, swarm_pid: int, hostname: str | None = None) -> ProbeResult:
    host = hostname or socket.gethostname()
    return ProbeResult({slot.name: _fresh_children(slot, swarm_pid, host)
                        for slot in topology.slots})


def _fresh_children(slot: Slot, swarm_pid: int, host: str) -> int:
    pool = slot.config.pool
    identities = [m.decode() for m in pool.call("SMEMBERS", keys.PROCESSES, idempotent=True)]
    rows = pool.pipeline([("HMGET", i, "info", "beat") for i in identities], idempotent=True)
    limit = STALE_BEATS * slot.config.heartbeat_interval
    now = time.time()
    fresh = 0
    for info_raw, beat in rows:
        if info_raw is None or beat is None:
            continue
        info = json.loads(info_raw)
        mine = (info.get("swarm_pid") == swarm_pid and info.get("hostname") == host
                and info.get("slot") == slot.name)
        if mine and now - float(beat) <= limit:
            fresh += 1
    return fresh

"""``wurk-swarm --probe``: is the swarm on this host alive and working?

For exec probes (Kubernetes liveness/readiness, scripts). It reads the
heartbeats in Redis and passes when every child the topology asks for has
beaten recently and belongs to the swarm with the given parent pid (PID 1
inside a container, where the swarm parent is the container's init).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

from supervisor.topology import Topology
from wurk import keys

# A beat older than this many heartbeat intervals counts as stale.
STALE_BEATS = 3


@dataclass(frozen=True)
class ProbeResult:
    fresh: int
    wanted: int

    @property
    def ok(self) -> bool:
        return self.fresh >= self.wanted


def probe(topology: Topology, swarm_pid: int, hostname: str | None = None) -> ProbeResult:
    host = hostname or socket.gethostname()
    pool = topology.base.pool
    identities = [m.decode() for m in pool.call("SMEMBERS", keys.PROCESSES, idempotent=True)]
    rows = pool.pipeline([("HMGET", i, "info", "beat") for i in identities], idempotent=True)
    limit = STALE_BEATS * topology.base.heartbeat_interval
    now = time.time()
    fresh = 0
    for info_raw, beat in rows:
        if info_raw is None or beat is None:
            continue
        info = json.loads(info_raw)
        if info.get("swarm_pid") != swarm_pid or info.get("hostname") != host:
            continue
        if now - float(beat) <= limit:
            fresh += 1
    return ProbeResult(fresh, sum(s.count for s in topology.slots))

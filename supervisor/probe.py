"""``wurk-swarm --probe``: is the swarm on this host alive and working?

For exec probes (Kubernetes liveness/readiness, scripts). It reads the
heartbeats in Redis (each slot's own Redis) of the children registered in
``processes`` that belong to the swarm with the given parent pid (PID 1
inside a container, where the swarm parent is the container's init) on this
host, and passes when every slot has at least one child that beat recently
and no child of the swarm is stale. At least one per slot, not the
topology's count: TTIN and TTOU change the count at run time, and a child
being replaced is briefly missing. No stale child at all: a stopped or
wedged child fails the probe until the parent has KILLed it, which also
takes it out of ``processes`` (``supervisor.reaped``).

Everything read from Redis is untrusted: a hash that does not parse counts
as some other process's, never as a crash of the probe.
"""

from __future__ import annotations

import json
import math
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from supervisor.topology import Slot, Topology
from wurk.wire import keys

# A beat older than this many heartbeat intervals counts as stale.
STALE_BEATS = 3


@dataclass(frozen=True)
class ProbeResult:
    fresh: dict[str, int]
    # "slot#index (pid N, beat S s ago)" for each child of the swarm that is stale.
    stale: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(count > 0 for count in self.fresh.values()) and not self.stale


def probe(topology: Topology, swarm_pid: int, hostname: str | None = None) -> ProbeResult:
    host = hostname or socket.gethostname()
    fresh: dict[str, int] = {}
    stale: list[str] = []
    for slot in topology.slots:
        ages = _beat_ages(slot, swarm_pid, host)
        limit = STALE_BEATS * slot.config.heartbeat_interval
        fresh[slot.name] = sum(1 for _, age in ages if age <= limit)
        stale += [f"{slot.name}#{label} (beat {age:.1f} s ago)" for label, age in ages
                  if age > limit]
    return ProbeResult(fresh, stale)


def _beat_ages(slot: Slot, swarm_pid: int, host: str) -> list[tuple[str, float]]:
    """(index and pid, seconds since its beat) of each of the swarm's children in this slot."""
    pool = slot.runtime.pool
    identities = [m.decode(errors="replace")
                  for m in pool.call("SMEMBERS", keys.PROCESSES, idempotent=True)]
    rows = pool.pipeline([("HMGET", i, "info", "beat") for i in identities], idempotent=True)
    now = time.time()
    ages = []
    for info_raw, beat_raw in rows:
        info, beat = _decode(info_raw), _number(beat_raw)
        if (info is None or info.get("swarm_pid") != swarm_pid or info.get("hostname") != host
                or info.get("slot") != slot.name):
            continue
        label = f"{info.get('index')} (pid {info.get('pid')})"
        ages.append((label, now - beat if beat is not None else float("inf")))
    return ages


def _decode(raw: Any) -> dict[str, Any] | None:
    try:
        info = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return None
    return info if isinstance(info, dict) else None


def _number(raw: Any) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None

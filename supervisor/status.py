"""USR2's status dump: one ``child.status`` log line per child of the swarm.

Duties:
1. ``log_status``: each child's slot, index, pid, RSS, busy count, age,
   seconds since its last liveness pulse, ready and retiring flags and
   identity, in slot and index order.
2. ``busy_counts``: the busy count from each child's heartbeat, read from its
   slot's own Redis in one round trip per slot with no replays, so a Redis
   outage cannot stall supervision for a whole retry schedule per child. A
   value that is not an integer (Redis data is untrusted) is left unknown.
3. ``rss_kb``: a child's resident memory (also the memory check's measure).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import psutil

from supervisor import liveness
from wurk.core import logging as wlog
from wurk.redis.pools import pool_for

if TYPE_CHECKING:
    from supervisor.swarm import Child

log = wlog.get_logger("wurk.swarm")


def log_status(children: Iterable[Child], now: float) -> None:
    ordered = sorted(children, key=lambda c: (c.slot.name, c.index))
    busy = busy_counts(ordered)
    for child in ordered:
        log.info("child.status", slot=child.slot.name, index=child.index, pid=child.pid,
                 rss_kb=rss_kb(child.pid), busy=busy.get(child.pid),
                 age=round(now - child.born, 1), ready=child.ready,
                 silent=round(liveness.silent_for(child, now), 1),
                 retiring=child.retiring, identity=child.identity)


def busy_counts(children: Iterable[Child]) -> dict[int, int]:
    """pid -> busy, for the children whose heartbeat says it."""
    by_slot: dict[str, list[Child]] = {}
    for child in children:
        if child.identity is not None:
            by_slot.setdefault(child.slot.name, []).append(child)
    counts: dict[int, int] = {}
    for name, asked in by_slot.items():
        try:
            with pool_for(asked[0].slot.config).conn() as conn:
                replies = conn.pipeline([("HGET", c.identity, "busy") for c in asked])
        except Exception as exc:  # noqa: BLE001 - a status dump must not fail on Redis trouble
            log.warning("swarm.status_busy_unknown", slot=name,
                        error=f"{type(exc).__name__}: {exc}")
            continue
        counts.update({c.pid: busy for c, value in zip(asked, replies, strict=True)
                       if (busy := _integer(value)) is not None})
    return counts


def rss_kb(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss // 1024)
    except psutil.Error:
        return 0


def _integer(value: object) -> int | None:
    try:
        return int(value) if isinstance(value, bytes | str | int) else None
    except ValueError:
        return None

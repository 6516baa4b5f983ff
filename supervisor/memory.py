"""Memory recycling: a child above its slot's ``max_memory_mb`` is replaced.

Duties:
1. :func:`rss_kb`: a child's resident memory (the status dump shows it too).
2. :class:`MemoryCheck` ``over_limit``: every ``memory_check_interval``
   (jittered by ±20 %), pick one ready child above its limit that is not
   already leaving, at random, so children that grow alike do not recycle
   together. The supervise loop asks it to drain; its respawn is the
   ordinary one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import psutil

from supervisor.children import Child
from wurk.core import logging as wlog

log = wlog.get_logger("wurk.swarm")


def rss_kb(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss // 1024)
    except psutil.Error:
        return 0


class MemoryCheck:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next_check = 0.0

    def over_limit(self, children: Iterable[Child], now: float) -> Child | None:
        """The child to recycle now, if a check is due and one is over its limit."""
        if now < self.next_check:
            return None
        self.next_check = now + self.interval * random.uniform(0.8, 1.2)
        over = [c for c in children
                if c.ready and not c.retiring and c.kill_at is None and c.slot.max_memory_mb
                and rss_kb(c.pid) > c.slot.max_memory_mb * 1024]
        if not over:
            return None
        child = random.choice(over)
        log.warning("child.memory_exceeded", **child.fields, rss_kb=rss_kb(child.pid),
                    limit_mb=child.slot.max_memory_mb)
        return child

"""Helpers for the periodic tests: a fast fake clock, entries, a process that
runs one periodic loop, and a lease that keeps believing it leads."""

from __future__ import annotations

import sys
import time
from typing import Any

from wurk.core import logging as wlog
from wurk.push.periodic import PeriodicEntry, make_entry
from wurk.runtime.leader import Leader
from wurk.runtime.periodic import PeriodicLoop
from wurk.settings.config import Config


class FakeClock:
    """Wall-clock time that a test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FastClock:
    """Simulated time running ``speed`` times faster than real time from
    ``base`` at real epoch ``t0``; processes given the same three agree."""

    def __init__(self, base: float, t0: float, speed: float) -> None:
        self.base, self.t0, self.speed = base, t0, speed

    def __call__(self) -> float:
        return self.base + (time.time() - self.t0) * self.speed


class StaleLease:
    """A leader that, once elected, always believes it leads and keeps the last
    fence it saw: the worst case of a process stopped between its check and its
    write. Only the fence inside Redis can stop it."""

    def __init__(self, real: Leader) -> None:
        self.real = real
        self.last: tuple[str, str] | None = None

    def start(self) -> Any:
        return self.real.start()

    def stop(self) -> None:
        self.real.stop()

    def is_leader(self) -> bool:
        self.fence()
        return self.last is not None

    def fence(self) -> tuple[str, str] | None:
        current = self.real.fence()
        if current is not None:
            self.last = current
        return self.last


def stamp_pid(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
              call_next: Any) -> None:
    import os

    payload["pushed_by"] = os.getpid()
    call_next()


def entries() -> list[PeriodicEntry]:
    return [make_entry("* * * * *", "Tick", name="minutely"),
            make_entry("*/2 * * * *", "Tick", name="two-minutely", queue="other")]


def main(argv: list[str]) -> None:
    """``periodic_support.py URL BASE T0 SPEED TTL STALE``: run a periodic loop
    on a fast clock until killed; its log lines go to stdout."""
    url, base, t0, speed, ttl, stale = argv
    wlog.setup("info", "json")
    config = Config(redis_url=url, client_middleware=[stamp_pid])
    real = Leader("periodic", ttl=float(ttl), config=config)
    lease: Any = StaleLease(real) if stale == "1" else real
    loop = PeriodicLoop(config, entries(), lease=lease,
                        clock=FastClock(float(base), float(t0), float(speed)),
                        interval=0.02, grace=600.0)
    loop.start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])

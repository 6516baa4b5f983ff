"""What the swarm parent tells systemd: READY once, then WATCHDOG pings while healthy.

Duties (all no-ops without ``NOTIFY_SOCKET``, ``supervisor.systemd``):
1. ``READY=1`` once, the first time every slot has its wanted count of
   ready children.
2. ``WATCHDOG=1`` every half ``WatchdogSec``, but only while every slot is
   full (ready children, or booting ones still pulsing) and every ready
   child pulsed lately. Judged by pulses, not by beats in Redis: a Redis
   outage must not get the whole swarm restarted by systemd, nor must a
   replacement child that waits it out (it pulses while it waits).
3. ``STOPPING=1`` when the drain begins.
"""

from __future__ import annotations

from collections.abc import Mapping

from supervisor import liveness
from supervisor.children import Child, SlotState, all_ready, live
from supervisor.status import status_line
from supervisor.systemd import Notifier


class Watchdog:
    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.announced_ready = False
        self.next_ping = 0.0

    def report(self, children: Mapping[int, Child], slots: Mapping[str, SlotState],
               now: float) -> None:
        if not self.notifier.enabled:
            return
        if all_ready(children, slots) and not self.announced_ready:
            self.announced_ready = True
            self.notifier.notify(READY=1, STATUS=status_line(children, slots))
        interval = self.notifier.watchdog_interval()
        if interval and self.announced_ready and _healthy(children, slots, now) \
                and now >= self.next_ping:
            self.next_ping = now + interval
            self.notifier.notify(WATCHDOG=1, STATUS=status_line(children, slots))

    def stopping(self) -> None:
        self.notifier.notify(STOPPING=1, STATUS="draining")


def _healthy(children: Mapping[int, Child], slots: Mapping[str, SlotState],
             now: float) -> bool:
    full = all(len([c for c in live(children, n) if liveness.present(c, now)]) >= s.wanted
               for n, s in slots.items())
    return full and liveness.all_fresh([c for c in children.values() if not c.retiring], now)

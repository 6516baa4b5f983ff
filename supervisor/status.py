"""How the swarm reports on itself: USR2's dump, its process title, its line in Redis.

Duties:
1. ``log_status`` (USR2): one ``child.status`` line per child with its slot,
   index, pid, RSS, busy count, age, seconds since its last liveness pulse,
   ready and retiring flags and identity, in slot and index order.
2. ``busy_counts``: the busy count from each child's heartbeat, read from its
   slot's own Redis in one round trip per slot with no replays, so a Redis
   outage cannot stall supervision for a whole retry schedule per child. A
   value that is not an integer (Redis data is untrusted) is left unknown.
3. ``status_line`` ("alpha: 2/2, beta: 1/3", live children of wanted), shown
   in the :class:`Title` (``wurk-swarm: parent running [...]``, set only when
   it changes and never inside a host, whose title it is) and sent to systemd.
4. ``snapshot``: the swarm's slots, ready children and state, as
   ``supervisor.remote`` beats them into ``wurk:swarms``.
5. ``log_booted``: ``swarm.booted``, once, when every slot first has all its
   children ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import setproctitle

from supervisor import liveness
from supervisor.children import Child, SlotState, live, wanted
from supervisor.memory import rss_kb
from supervisor.remote import SwarmSnapshot
from wurk.core import logging as wlog

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
            with asked[0].slot.runtime.pool.conn() as conn:
                replies = conn.pipeline([("HGET", c.identity, "busy") for c in asked])
        except Exception as exc:  # noqa: BLE001 - a status dump must not fail on Redis trouble
            log.warning("swarm.status_busy_unknown", slot=name,
                        error=f"{type(exc).__name__}: {exc}")
            continue
        counts.update({c.pid: busy for c, value in zip(asked, replies, strict=True)
                       if (busy := _integer(value)) is not None})
    return counts


def _integer(value: object) -> int | None:
    try:
        return int(value) if isinstance(value, bytes | str | int) else None
    except ValueError:
        return None


def status_line(children: Mapping[int, Child], slots: Mapping[str, SlotState]) -> str:
    return ", ".join(f"{n}: {len(live(children, n))}/{s.wanted}" for n, s in slots.items())


class Title:
    def __init__(self, hosted: bool) -> None:
        self.hosted = hosted
        self.current = ""

    def show(self, state: str, children: Mapping[int, Child],
             slots: Mapping[str, SlotState]) -> None:
        if self.hosted:
            return
        title = f"wurk-swarm: parent {state} [{status_line(children, slots)}]"
        if title != self.current:
            self.current = title
            setproctitle.setproctitle(title)


def snapshot(children: Iterable[Child], slots: Mapping[str, SlotState],
             state: str) -> SwarmSnapshot:
    ready = sorted((c.slot.name, c.index, c.identity) for c in children
                   if c.identity is not None)
    restarts = {name: {str(i): n for i, n in sorted(s.restarts.items())}
                for name, s in slots.items() if s.restarts}
    return SwarmSnapshot(slots=wanted(slots),
                         children=[identity for _, _, identity in ready], state=state,
                         restarts=restarts)


def log_booted(children: Iterable[Child], slots: Mapping[str, SlotState],
               seconds: float) -> None:
    log.info("swarm.booted", ready=sum(c.ready for c in children),
             slots=wanted(slots), seconds=round(seconds, 3))

"""Child liveness: how the parent notices a child that stopped (SIGSTOP, a deadlock).

A child's heartbeat loop pulses the parent through the child's ready pipe
(which stays open for the child's whole life) after every beat attempt,
whether Redis took the beat or not. The channel never touches Redis, so a
Redis outage or a full Redis cannot make a healthy child look hung: its
beats fail, its pulses keep coming. A SIGSTOPped or wedged child stops
pulsing.

Duties:
1. Child side: :func:`pulser` gives the heartbeat a callable that writes one
   byte to the pipe without ever blocking (a full pipe or a gone parent is
   ignored: the parent reads every tick, and an orphan has no one to tell).
2. Parent side: :func:`read_pipe` drains a child's pipe without blocking;
   any byte is a pulse (the first line is the identity the child sends when
   it is ready). :func:`read_child` notes the pulse, hands the job timer's
   notes to ``supervisor.overrun``, closes the pipe at end of file and
   hands back the identity when the ready line has just come.
3. :func:`hung` picks the ready children silent for longer than their slot's
   ``child_timeout`` (the supervise loop KILLs and replaces them), and
   :func:`all_fresh` says whether every ready child pulsed within
   :data:`FRESH_BEATS` heartbeat intervals (the systemd watchdog is fed only
   then). A child still booting is never judged hung. While it waits for
   Redis it pulses too, and :func:`present` counts it (ready, or pulsing
   lately) when the watchdog asks whether each slot is full.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from supervisor import overrun

if TYPE_CHECKING:
    from supervisor.children import Child

PULSE = b"."
# A ready child that has not pulsed for this many heartbeat intervals is stale.
FRESH_BEATS = 3


def pulser(fd: int) -> Callable[[], None]:
    """A callable that pulses the parent through ``fd`` and never blocks or raises."""
    os.set_blocking(fd, False)

    def pulse() -> None:
        with contextlib.suppress(OSError):  # full pipe, or no parent to read it
            os.write(fd, PULSE)
    return pulse


def read_pipe(fd: int) -> bytes | None:
    """What the child wrote since the last read (b"" if nothing), or None at end of file."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return data
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk


def read_child(child: Child, now: float) -> str | None:
    """Read ``child``'s pipe; its identity if this read brought its ready line."""
    if child.ready_fd is None:
        return None
    data = read_pipe(child.ready_fd)
    if data is None:
        close_pipe(child)
        return None
    if data:
        child.last_pulse = now
        if b"\n" in data:
            overrun.absorb(child, data)
    # Before its ready line a child may pulse too (waiting for Redis).
    line, newline, _ = data.lstrip(PULSE).partition(b"\n")
    if child.identity is None and newline and line.strip():
        return line.decode(errors="replace").strip()
    return None


def close_pipe(child: Child) -> None:
    if child.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.close(child.ready_fd)
        child.ready_fd = None


def silent_for(child: Child, now: float) -> float:
    return now - child.last_pulse


def hung(children: Iterable[Child], now: float) -> list[Child]:
    """Ready children silent past their slot's child_timeout, not already being stopped."""
    return [c for c in children if c.ready and c.kill_at is None
            and silent_for(c, now) > c.slot.child_timeout]


def all_fresh(children: Iterable[Child], now: float) -> bool:
    """Every ready child pulsed within FRESH_BEATS of its slot's heartbeat intervals."""
    return all(silent_for(c, now) <= FRESH_BEATS * c.slot.config.heartbeat_interval
               for c in children if c.ready)


def present(child: Child, now: float) -> bool:
    """Ready, or still booting and pulsing (waiting out a Redis outage)."""
    limit = FRESH_BEATS * child.slot.config.heartbeat_interval
    return child.ready or silent_for(child, now) <= limit

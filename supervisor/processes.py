"""The swarm's children as processes: fork, signal, KILL, reap.

Duties:
1. :func:`spawn`: fork a child for a slot and index with its ready pipe,
   freezing the parent's heap first (``gc_freeze``) so the child shares it
   copy-on-write. A fork that fails (out of descriptors, processes or
   memory) is logged and answered with None, never raised: the caller backs
   the slot off instead of dying.
2. :func:`stop` asks a child to drain (TERM once, with the moment it will be
   KILLed); :func:`kill` KILLs it once; :func:`kill_overdue` and
   :func:`kill_hung` KILL the children past their drain time or silent past
   ``child_timeout`` (``supervisor.liveness``), and :func:`kill_all` what is
   left when the swarm's own drain runs out.
3. :func:`exited`: exit statuses without blocking. As PID 1 reap anything
   (orphans re-parented to us included); otherwise only our own pids, so a
   host process's other children are never stolen. :func:`log_exit` says
   how a child ended, and warns of a KILL we did not send.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from supervisor import liveness
from supervisor.child_boot import run_child
from supervisor.children import Child
from wurk.core import logging as wlog
from wurk.core import pids

if TYPE_CHECKING:
    from supervisor.topology import Slot

log = wlog.get_logger("wurk.swarm")
# What a child reaped by someone else is reported as: "exited 255".
UNKNOWN_STATUS = 255 << 8
KILLED = float("inf")


def spawn(slot: Slot, index: int, *, owner_pid: int, gc_freeze: bool,
          inherited: list[int]) -> Child | None:
    """The new child, or None when the fork failed. ``inherited`` are the
    parent's descriptors the child closes first."""
    try:
        ready_r, ready_w = os.pipe()
        pid = _fork(ready_r, ready_w, gc_freeze)
    except OSError as exc:  # out of descriptors, processes or memory: never die of it
        log.error("child.spawn_failed", slot=slot.name, index=index,
                  error=f"{type(exc).__name__}: {exc}")
        return None
    if pid == 0:
        run_child(slot, index, owner_pid, ready_w, [*inherited, ready_r])
    os.close(ready_w)
    os.set_blocking(ready_r, False)
    child = Child(slot, index, pid, ready_r)
    log.info("child.spawned", **child.fields)
    return child


def _fork(ready_r: int, ready_w: int, gc_freeze: bool) -> int:
    if gc_freeze:
        gc.freeze()
    with warnings.catch_warnings():
        # 3.12+ warns about forking a threaded process; we reset what we own.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return os.fork()
        except OSError:
            os.close(ready_r)
            os.close(ready_w)
            raise


def signal_child(child: Child, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signum)


def stop(child: Child, grace: float) -> None:
    """TERM, once: the child drains, and is KILLed if it overruns its slot's
    shutdown_timeout plus ``grace``."""
    if child.kill_at is None:
        child.kill_at = time.monotonic() + child.slot.config.shutdown_timeout + grace
        signal_child(child, signal.SIGTERM)


def kill(child: Child) -> None:
    """KILL, once: a kill_at of :data:`KILLED` marks a child already KILLed."""
    signal_child(child, signal.SIGKILL)
    child.kill_at = KILLED


def kill_overdue(children: Iterable[Child], now: float) -> None:
    for child in [c for c in children if c.kill_at is not None and now >= c.kill_at]:
        log.warning("child.kill", **child.fields, reason="drain timed out")
        kill(child)


def kill_hung(children: Iterable[Child], now: float) -> None:
    for child in liveness.hung(children, now):
        log.error("child.hung", **child.fields, silent=round(liveness.silent_for(child, now), 1),
                  child_timeout=child.slot.child_timeout)
        kill(child)


def kill_all(children: Iterable[Child]) -> None:
    for child in children:
        if child.kill_at != KILLED:
            log.warning("child.kill", **child.fields, reason="swarm drain timed out")
            kill(child)


def exited(children: Mapping[int, Child]) -> list[tuple[int, int]]:
    """(pid, wait status) of each child that has exited."""
    found: list[tuple[int, int]] = []
    for target in [-1] if os.getpid() == 1 else list(children):
        found += _wait(target)
    return found


def _wait(target: int) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(target, os.WNOHANG)
        except ChildProcessError:
            if target != -1 and not pids.alive(target):
                # Someone else reaped it (a host that waits on every
                # child); its status is lost, so report it as unknown.
                found.append((target, UNKNOWN_STATUS))
            return found
        if pid == 0:
            return found
        found.append((pid, status))
        if target != -1:
            return found


def log_exit(child: Child, code: int) -> None:
    if code == -signal.SIGKILL and child.kill_at is None:
        log.warning("child.killed", hint="SIGKILL we did not send: possibly the OOM killer",
                    **child.fields, exit=describe_exit(code))
    else:
        log.info("child.exited", **child.fields, exit=describe_exit(code))


def describe_exit(code: int) -> str:
    if code >= 0:
        return f"status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:  # e.g. SIGRTMIN+3, which has no Signals member
        return f"signal {-code}"

"""Swarm remote control: the swarm parent's presence in Redis and the signals it obeys.

The parent works no jobs, so it is no Sidekiq process and stays out of
``processes``. It registers in the SET ``wurk:swarms`` and a HASH under its
own identity, ``<hostname>:<pid>:swarm-<12 hex>``, which ``wurk.api.swarms``
and ``wurk swarms`` read; ``wurk quiet|stop|restart --swarm`` push signals
onto ``<identity>-signals`` as the admin API does for a process.

Duties:
1. Name the swarm and describe it in its hash: ``info`` (JSON: identity,
   hostname, pid, started_at, slots with their wanted counts, topology path),
   ``beat`` (epoch seconds), ``state`` (running, quiet or draining) and
   ``children`` (a JSON list of the children's identities); ``info`` also
   holds ``restarts``, per slot and index the times a child there exited
   and was respawned (a crash, a kill, a remote stop; not a rolling restart
   or a scale-down).
2. ``refresh``, called on every supervise tick, acts at most once per
   ``heartbeat_interval``: one script (``wurk.wire.lua.BEAT``, as a worker's
   heartbeat) RPOPs one signal, registers and rewrites the hash with a 60 s
   TTL, so it still lands when Redis is at maxmemory; the signal goes to
   the swarm as a command (see :data:`SIGNAL_COMMANDS`). ``TTIN:<slot>``
   and ``TTOU:<slot>`` scale one slot only (``more:<slot>``, ``fewer:<slot>``);
   a swarm of an older wurk ignores them as unknown signals.
3. ``unregister`` when the drain ends: leave the set, delete the hash and
   any signals still queued.
4. Never stall or crash supervision over Redis: one try per call, never a
   replay (``attempts=1``); a failure is logged and the next refresh tries
   again. The worst case is one read timeout per heartbeat interval.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wurk.core import logging as wlog
from wurk.redis.runtime import Runtime, handed
from wurk.wire import keys
from wurk.wire.lua import BEAT

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = wlog.get_logger("wurk.swarm")

# What a remote signal asks of the whole swarm: the same verbs as the real
# signals ``wurk-swarm`` handles (supervisor/cli.py).
SIGNAL_COMMANDS = {
    "TSTP": "quiet", "TERM": "shutdown", "TTIN": "more", "TTOU": "fewer",
    "USR1": "restart", "HUP": "restart", "USR2": "status",
}
# The signals that may name one slot: ``TTIN:<slot>``.
SLOT_SIGNALS = ("TTIN", "TTOU")


def swarm_identity(pid: int | None = None, hostname: str | None = None) -> str:
    """``<hostname>:<pid>:swarm-<12 hex>``; the hostname as a process's heartbeat names it."""
    host = hostname or os.environ.get("DYNO") or socket.gethostname()
    return f"{host}:{pid or os.getpid()}:swarm-{secrets.token_hex(6)}"


@dataclass(frozen=True)
class SwarmSnapshot:
    """What the swarm reports about itself at one refresh."""

    slots: dict[str, int]
    children: list[str]
    state: str
    restarts: dict[str, dict[str, int]] = field(default_factory=dict)


class RemoteControl:
    def __init__(self, config: Config, topology_path: Path,
                 on_command: Callable[[str], None], *,
                 clock: Callable[[], float] = time.monotonic,
                 runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.identity = swarm_identity()
        self.on_command = on_command
        self._clock = clock
        self._info: dict[str, Any] = {
            "identity": self.identity, "hostname": self.identity.rsplit(":", 2)[0],
            "pid": os.getpid(), "started_at": time.time(),
            "topology": str(Path(topology_path).absolute()),
            # Readers call a swarm stale once two of its beats are missing.
            "beat_interval": self.config.heartbeat_interval,
        }
        self._next_refresh = 0.0
        self._touched = False  # a registration was sent (maybe applied): clean up at the end

    def refresh(self, snapshot: SwarmSnapshot) -> None:
        """Register, describe and take one signal, if a heartbeat interval has passed."""
        now = self._clock()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.config.heartbeat_interval
        self._touched = True
        fields = self._fields(snapshot)
        try:
            signal = self.runtime.pool.run(lambda c: BEAT.run(
                c, [keys.SWARMS, self.identity, keys.signals(self.identity)],
                [self.identity, keys.HEARTBEAT_TTL, *fields]), attempts=1)
        except Exception as exc:  # noqa: BLE001 - Redis trouble: try again next refresh
            log.warning("swarm.remote_failed", identity=self.identity,
                        error=f"{type(exc).__name__}: {exc}")
            return
        if signal is not None:
            self._obey(_text(signal))

    def _fields(self, snapshot: SwarmSnapshot) -> list[Any]:
        info = json.dumps({**self._info, "slots": snapshot.slots,
                           "restarts": snapshot.restarts})
        return ["info", info, "beat", repr(time.time()), "state", snapshot.state,
                "children", json.dumps(snapshot.children)]

    def _obey(self, name: str) -> None:
        base, one_slot, slot = name.partition(":")
        command = SIGNAL_COMMANDS.get(base)
        if command is None or (one_slot and (base not in SLOT_SIGNALS or not slot)):
            log.warning("swarm.unknown_signal", identity=self.identity, signal=name[:200])
            return
        if one_slot:
            command = f"{command}:{slot}"
        log.info("swarm.remote_signal", identity=self.identity, signal=name, command=command)
        self.on_command(command)

    def unregister(self) -> None:
        """Leave ``wurk:swarms`` and delete the hash and queued signals (one try)."""
        if not self._touched:
            return
        self._touched = False
        try:
            # Replay-safe, but one try all the same: the swarm is exiting and
            # a leftover hash expires within a minute anyway.
            self.runtime.pool.pipeline(
                [("SREM", keys.SWARMS, self.identity),
                 ("UNLINK", self.identity, keys.signals(self.identity))],
                idempotent=True, attempts=1)
        except Exception as exc:  # noqa: BLE001 - the hash expires on its own
            log.warning("swarm.unregister_failed", identity=self.identity,
                        error=f"{type(exc).__name__}: {exc}")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

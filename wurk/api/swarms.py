"""Swarms: the ``wurk-swarm`` parents that are alive, and remote control of them.

A swarm parent works no jobs, so it is not in ``processes``; it beats into
the SET ``wurk:swarms`` and a hash under its identity
(``<hostname>:<pid>:swarm-<hex>``) from its supervise loop, with a 60 s TTL
(``supervisor.remote`` writes them).

Duties:
1. :class:`SwarmSet`: iterate the live swarms (members whose hash still has
   ``info``), sorted by identity, pruning the members whose hash expired;
   look one up by identity, raising :class:`UnknownSwarmError`.
2. :class:`SwarmProcess`: read ``info`` (hostname, pid, started_at, slots,
   topology, restarts per slot and index, beat interval), ``beat``,
   ``state`` and ``children`` leniently: a bad field reads as empty, never
   as an error. A swarm whose last beat is more than two of its beat
   intervals old is ``stale``: its parent was killed or hangs, though its
   hash has not expired yet.
3. Remote control: ``quiet``/``stop``/``restart`` queue TSTP/TERM/USR1 on
   ``<identity>-signals`` (LPUSH + EXPIRE 60 in one MULTI); the parent picks
   one up per heartbeat interval and acts on every child; ``scale`` queues
   TTIN/TTOU, or ``TTIN:<slot>``/``TTOU:<slot>`` for one slot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from wurk.api.errors import UnknownProcessError
from wurk.core.validate import is_number
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.replies import resolve, send_signal, sscan_all, text, to_float, to_int

if TYPE_CHECKING:
    from wurk.redis.connection import Conn

# The hash fields a reader needs, in the order SwarmProcess.from_fields expects.
FIELDS = ("info", "beat", "state", "children")
# A swarm of a wurk that did not write its interval beats at the default.
DEFAULT_BEAT_INTERVAL = 5.0
MISSED_BEATS = 2


class UnknownSwarmError(UnknownProcessError):
    """No live swarm has that identity (never registered, drained, or its beat expired)."""

    def __init__(self, identity: str) -> None:
        LookupError.__init__(self, f"no live swarm with identity {identity!r}")
        self.identity = identity


class SwarmProcess:
    """One live swarm parent as of its last beat."""

    def __init__(self, identity: str, info: dict[str, Any], fields: dict[str, str | None], *,
                 config: Config | None = None) -> None:
        self.identity = identity
        self.info = info
        self.fields = fields
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    @classmethod
    def from_fields(cls, identity: str, values: Sequence[Any], *,
                    config: Config | None = None) -> SwarmProcess | None:
        """From an HMGET of FIELDS; None when ``info`` is gone (the beat expired)."""
        if not values or values[0] is None:
            return None
        try:
            info = json.loads(values[0])
        except (ValueError, RecursionError):
            return None
        fields = {name: None if v is None else text(v)
                  for name, v in zip(FIELDS[1:], values[1:], strict=True)}
        return cls(identity, info if isinstance(info, dict) else {}, fields, config=config)

    def __repr__(self) -> str:
        return f"<SwarmProcess {self.identity} {self.state} children={len(self.children)}>"

    @property
    def hostname(self) -> str:
        return text(self.info.get("hostname"))

    @property
    def pid(self) -> int:
        return to_int(self.info.get("pid"))

    @property
    def started_at(self) -> float | None:
        started = self.info.get("started_at")
        return float(started) if isinstance(started, int | float) else None

    @property
    def topology(self) -> str:
        return text(self.info.get("topology"))

    @property
    def slots(self) -> dict[str, int]:
        """Slot name to the number of children wanted (changes with TTIN/TTOU)."""
        slots = self.info.get("slots")
        if not isinstance(slots, dict):
            return {}
        return {str(name): to_int(count) for name, count in slots.items()}

    @property
    def restarts(self) -> dict[tuple[str, int], int]:
        """(slot, index) to the times a child there exited and was respawned;
        empty for a swarm of an older wurk, which does not report them."""
        found: dict[tuple[str, int], int] = {}
        slots = self.info.get("restarts")
        for name, indexes in (slots.items() if isinstance(slots, dict) else ()):
            for index, count in (indexes.items() if isinstance(indexes, dict) else ()):
                if to_int(index, -1) >= 0 and to_int(count, -1) >= 0:
                    found[(str(name), to_int(index))] = to_int(count)
        return found

    @property
    def beat(self) -> float:
        return to_float(self.fields.get("beat"))

    @property
    def beat_interval(self) -> float:
        interval = self.info.get("beat_interval")
        if not is_number(interval) or not 0 < interval < 3600:
            return DEFAULT_BEAT_INTERVAL
        return float(interval)

    def stale(self, now: float | None = None) -> bool:
        """No beat for more than two intervals: the parent is gone or stuck."""
        at = time.time() if now is None else now
        return at - self.beat > MISSED_BEATS * self.beat_interval

    @property
    def state(self) -> str:
        """``running``, ``quiet``, ``draining``, or ``stale`` when its beats stopped."""
        if self.stale():
            return "stale"
        return self.fields.get("state") or "running"

    @property
    def children(self) -> list[str]:
        """The identities of the children that have registered (see ``wurk processes``)."""
        try:
            children = json.loads(self.fields.get("children") or "[]")
        except (ValueError, RecursionError):
            return []
        return [str(c) for c in children] if isinstance(children, list) else []

    # -- remote control ---------------------------------------------------
    def quiet(self) -> None:
        """Quiet every child (TSTP) and stop respawning, at the swarm's next beat."""
        self.signal("TSTP")

    def stop(self) -> None:
        """Drain every child and exit (TERM) at the swarm's next beat."""
        self.signal("TERM")

    def restart(self) -> None:
        """Rolling restart, one child at a time, replacement first (USR1)."""
        self.signal("USR1")

    def scale(self, more: bool, slot: str | None = None) -> None:
        """One child more (TTIN) or fewer (TTOU) in every slot, or in ``slot`` only."""
        name = "TTIN" if more else "TTOU"
        self.signal(f"{name}:{slot}" if slot else name)

    def signal(self, name: str) -> None:
        send_signal(self.runtime.pool, self.identity, name)


class SwarmSet:
    """The swarm parents that beat into ``wurk:swarms``."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def __iter__(self) -> Iterator[SwarmProcess]:
        """Live swarms, sorted by identity; members whose beat expired are pruned."""
        swarms, expired = self.runtime.pool.run(self._read_all, idempotent=True)
        if expired:
            self.prune(expired)
        return iter(swarms)

    def _read_all(self, conn: Conn) -> tuple[list[SwarmProcess], list[str]]:
        identities = sscan_all(conn, keys.SWARMS)
        rows = conn.pipeline([("HMGET", identity, *FIELDS) for identity in identities])
        swarms, expired = [], []
        for identity, row in zip(identities, rows, strict=True):
            swarm = SwarmProcess.from_fields(identity, row, config=self.config)
            if swarm is None:
                expired.append(identity)
            else:
                swarms.append(swarm)
        return swarms, expired

    def prune(self, identities: Sequence[str]) -> int:
        """Forget these identities; returns how many were removed.

        A swarm that re-registers between the read and this SREM drops out of
        the set until its next beat re-adds it (one heartbeat interval).
        """
        # Replay-safe: removing an absent member changes nothing.
        return int(self.runtime.pool.call("SREM", keys.SWARMS, *identities, idempotent=True))

    @property
    def size(self) -> int:
        """SCARD ``wurk:swarms``: unpruned until the next iteration."""
        return int(self.runtime.pool.call("SCARD", keys.SWARMS, idempotent=True))

    def __len__(self) -> int:
        return self.size

    def get(self, identity: str) -> SwarmProcess | None:
        """The live swarm ``identity``: registered and beat unexpired, else None."""
        member, row = self.runtime.pool.pipeline(
            [("SISMEMBER", keys.SWARMS, identity), ("HMGET", identity, *FIELDS)],
            idempotent=True)
        return SwarmProcess.from_fields(identity, row, config=self.config) if member else None

    def lookup(self, identity: str) -> SwarmProcess:
        """As ``get``, raising :class:`UnknownSwarmError` when there is none."""
        swarm = self.get(identity)
        if swarm is None:
            raise UnknownSwarmError(identity)
        return swarm

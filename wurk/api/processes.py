"""Processes: who is alive, what they report, and remote control (spec §9, §10).

Duties:
1. :class:`ProcessSet`: iterate the live processes (members of
   ``processes`` whose heartbeat hash still has ``info``), look one up by
   identity, sum their concurrency and RSS, and name the Enterprise leader.
2. ``cleanup()``: drop identities whose heartbeat expired, at most once a
   minute cluster-wide (``SET process_cleanup 1 NX EX 60``), as Sidekiq 6.5+.
3. :class:`Process`: every field the Busy page shows, read the way each
   Sidekiq version writes it (8.1.2+ keeps ``concurrency`` in the hash).
4. Remote control: ``quiet``/``stop``/``dump_threads`` queue a signal the
   process picks up on its next heartbeat; embedded processes refuse quiet
   and stop, as Sidekiq 8 does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from wurk.api.errors import ProcessControlError, UnknownProcessError
from wurk.core.validate import is_whole
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import to_seconds
from wurk.wire.replies import opt_text, resolve, send_signal, sscan_all, text, to_float, to_int

if TYPE_CHECKING:
    from wurk.redis.connection import Conn

# The hash fields a reader needs, in the order Process.from_fields expects.
FIELDS = ("info", "busy", "beat", "quiet", "rss", "rtt_us", "concurrency")
CLEANUP_LOCK_TTL = 60


class Process:
    """One live process as of its last heartbeat."""

    def __init__(self, identity: str, info: dict[str, Any], fields: dict[str, Any], *,
                 config: Config | None = None) -> None:
        self.identity = identity
        self.info = info
        self.fields = fields  # the decoded heartbeat hash fields other than info
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    @classmethod
    def from_fields(cls, identity: str, values: Sequence[Any], *,
                    config: Config | None = None) -> Process | None:
        """From an HMGET of FIELDS; None when ``info`` is gone (heartbeat expired)."""
        if not values or values[0] is None:
            return None
        try:
            info = json.loads(values[0])
        except (ValueError, RecursionError):
            return None
        fields = {name: opt_text(v) for name, v in zip(FIELDS[1:], values[1:], strict=True)}
        return cls(identity, info if isinstance(info, dict) else {}, fields, config=config)

    def __repr__(self) -> str:
        return f"<Process {self.identity} busy={self.busy}/{self.concurrency}>"

    def __getitem__(self, key: str) -> Any:
        """A raw value: hash fields first, then ``info`` (Sidekiq's Process#[])."""
        return self.fields[key] if self.fields.get(key) is not None else self.info.get(key)

    # -- from info --------------------------------------------------------
    @property
    def hostname(self) -> str:
        return text(self.info.get("hostname"))

    @property
    def pid(self) -> int:
        return to_int(self.info.get("pid"))

    @property
    def tag(self) -> str:
        return text(self.info.get("tag"))

    @property
    def labels(self) -> list[str]:
        labels = self.info.get("labels")
        return [str(x) for x in labels] if isinstance(labels, list) else []

    @property
    def queues(self) -> list[str]:
        queues = self.info.get("queues")
        return [str(x) for x in queues] if isinstance(queues, list) else []

    @property
    def started_at(self) -> float | None:
        return to_seconds(self.info.get("started_at"))

    @property
    def version(self) -> str | None:
        version = self.info.get("version")
        return version if isinstance(version, str) else None

    @property
    def embedded(self) -> bool:
        return self.info.get("embedded") is True

    @property
    def slot(self) -> str | None:
        """The swarm slot this child serves; None outside a swarm."""
        slot = self.info.get("slot")
        return slot if isinstance(slot, str) else None

    @property
    def index(self) -> int | None:
        index = self.info.get("index")
        return index if is_whole(index) else None

    # -- from the heartbeat hash ------------------------------------------
    @property
    def concurrency(self) -> int:
        """The hash field (Sidekiq 8.1.2+ and wurk), else the 6.4-8.1.1 ``info`` value."""
        field = self.fields.get("concurrency")
        return to_int(field) if field is not None else to_int(self.info.get("concurrency"))

    @property
    def busy(self) -> int:
        return to_int(self.fields.get("busy"))

    @property
    def beat(self) -> float:
        return to_float(self.fields.get("beat"))

    @property
    def is_quiet(self) -> bool:
        """Quieted (TSTP): takes no new work. ``quiet()`` is the command."""
        return self.fields.get("quiet") == "true"

    stopping = is_quiet  # Sidekiq's Process#stopping?

    @property
    def rss(self) -> int:
        """Resident memory in KB."""
        return to_int(self.fields.get("rss"))

    @property
    def rtt_us(self) -> int:
        return to_int(self.fields.get("rtt_us"))

    @property
    def is_leader(self) -> bool:
        leader = self.runtime.pool.call("GET", keys.LEADER, idempotent=True)
        return text(leader) == self.identity

    # -- remote control ---------------------------------------------------
    def quiet(self) -> None:
        """Ask the process to stop taking work (TSTP) at its next heartbeat."""
        self._refuse_if_embedded("quiet")
        self.signal("TSTP")

    def stop(self) -> None:
        """Ask the process to shut down (TERM) at its next heartbeat."""
        self._refuse_if_embedded("stop")
        self.signal("TERM")

    def dump_threads(self) -> None:
        """Ask the process to log every thread's stack (TTIN)."""
        self.signal("TTIN")

    def _refuse_if_embedded(self, verb: str) -> None:
        if self.embedded:
            raise ProcessControlError(
                f"can't {verb} embedded process {self.identity}: it runs inside another "
                "program (a web server), which owns its lifecycle")

    def signal(self, name: str) -> None:
        send_signal(self.runtime.pool, self.identity, name)


class ProcessSet:
    """The processes that heartbeat into ``processes``.

    Iteration and lookups read each heartbeat hash, so an expired identity
    never shows whether or not it was pruned. Pruning the set itself is the
    explicit ``cleanup()`` (Sidekiq's ProcessSet.new runs it on construction).
    """

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def __iter__(self) -> Iterator[Process]:
        """Live processes, sorted by identity; members whose heartbeat expired are skipped."""
        return iter(self.runtime.pool.run(self._read_all, idempotent=True))

    def _read_all(self, conn: Conn) -> list[Process]:
        identities = sscan_all(conn, keys.PROCESSES)
        rows = conn.pipeline([("HMGET", identity, *FIELDS) for identity in identities])
        found = (Process.from_fields(i, row, config=self.config)
                 for i, row in zip(identities, rows, strict=True))
        return [process for process in found if process is not None]

    @property
    def size(self) -> int:
        """SCARD ``processes``: unpruned, so it counts crashed processes until a cleanup."""
        return int(self.runtime.pool.call("SCARD", keys.PROCESSES, idempotent=True))

    def __len__(self) -> int:
        return self.size

    @property
    def total_concurrency(self) -> int:
        return sum(process.concurrency for process in self)

    @property
    def total_rss_in_kb(self) -> int:
        return sum(process.rss for process in self)

    @property
    def leader(self) -> str:
        """The Enterprise leader's identity (``dear-leader``), or ""."""
        return text(self.runtime.pool.call("GET", keys.LEADER, idempotent=True))

    def get(self, identity: str) -> Process | None:
        """The live process ``identity``: registered and heartbeat unexpired, else None."""
        member, row = self.runtime.pool.pipeline(
            [("SISMEMBER", keys.PROCESSES, identity), ("HMGET", identity, *FIELDS)],
            idempotent=True)
        return Process.from_fields(identity, row, config=self.config) if member else None

    def lookup(self, identity: str) -> Process:
        """As ``get``, raising :class:`UnknownProcessError` when there is none."""
        process = self.get(identity)
        if process is None:
            raise UnknownProcessError(identity)
        return process

    def cleanup(self) -> int:
        """Forget identities whose heartbeat expired; returns how many.

        Runs at most once a minute across the cluster: 0 when another caller
        holds the lock.
        """
        # Not replay-safe, as the seed says: a replay re-decides which
        # identities are dead and could prune one that registered in between.
        # A blip here just skips one prune; the next caller does it.
        return self.runtime.pool.run(_cleanup)


def _cleanup(conn: Conn) -> int:
    if conn.call("SET", keys.PROCESS_CLEANUP_LOCK, 1, "NX", "EX", CLEANUP_LOCK_TTL) is None:
        return 0
    identities = sscan_all(conn, keys.PROCESSES)
    infos = conn.pipeline([("HGET", identity, "info") for identity in identities])
    dead = [i for i, info in zip(identities, infos, strict=True) if info is None]
    return int(conn.call("SREM", keys.PROCESSES, *dead)) if dead else 0

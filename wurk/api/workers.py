"""Jobs running right now, per process and thread (spec §9.3).

Duties:
1. Read each live process's in-flight hash: ``<identity>:work`` (Sidekiq
   6.5+ and wurk), falling back to ``<identity>:workers`` (6.4's name).
   A process whose heartbeat hash is gone is skipped, as 6.4 does.
2. Decode each entry: ``queue``, ``payload`` (the job JSON as a string, so
   JSON-in-JSON, or an object a hand or an old writer left) and ``run_at``
   (epoch seconds, or Sidekiq 8's ms); yield them sorted by ``run_at``.
3. ``size``: the sum of ``busy`` over processes, as Sidekiq counts it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from wurk.api.records import JobRecord
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import dumps, to_seconds
from wurk.wire.replies import hash_items, resolve, sscan_all, text, to_int

if TYPE_CHECKING:
    from wurk.redis.connection import Conn


@dataclass(frozen=True)
class Work:
    """One running job: where it came from, what it is, since when."""

    queue: str
    payload: dict[str, Any]
    run_at: float
    raw: dict[str, Any] = field(repr=False, compare=False)
    config: Config | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, value: bytes | str, config: Config | None = None) -> Work | None:
        try:
            raw = json.loads(value)
        except (ValueError, RecursionError):
            return None
        if not isinstance(raw, dict):
            return None
        payload = raw.get("payload")
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except (ValueError, RecursionError):
                payload = None
        return cls(queue=text(raw.get("queue")),
                   payload=payload if isinstance(payload, dict) else {},
                   run_at=to_seconds(raw.get("run_at")) or 0.0, raw=raw, config=config)

    @property
    def job(self) -> JobRecord:
        """The payload as a record, for its display class, args and jid."""
        return JobRecord(dumps(self.payload), self.queue, config=self.config)

    def __getitem__(self, key: str) -> Any:
        """Sidekiq's work-hash shape: ``work["queue"]``, ``["payload"]``, ``["run_at"]``."""
        return {"queue": self.queue, "payload": self.payload, "run_at": self.run_at}[key]


class WorkEntry(NamedTuple):
    process: str
    thread: str
    work: Work


class Workers:
    """Sidekiq's WorkSet: ``for identity, thread, work in Workers(): ...``."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def __iter__(self) -> Iterator[WorkEntry]:
        entries = self.runtime.pool.run(lambda c: _read_work(c, self.config), idempotent=True)
        return iter(sorted(entries, key=lambda e: (e.work.run_at, e.process, e.thread)))

    @property
    def size(self) -> int:
        """Jobs in flight: the sum of ``busy`` over ``processes`` (as of each last beat)."""
        return int(self.runtime.pool.run(_busy_total, idempotent=True))

    def __len__(self) -> int:
        return self.size


def _read_work(conn: Conn, config: Config) -> list[WorkEntry]:
    identities = sscan_all(conn, keys.PROCESSES)
    commands: list[tuple[Any, ...]] = []
    for identity in identities:
        commands += [("EXISTS", identity), ("HGETALL", keys.work(identity)),
                     ("HGETALL", keys.work_6_4(identity))]
    replies = conn.pipeline(commands)
    entries: list[WorkEntry] = []
    for n, identity in enumerate(identities):
        alive, work, work_6_4 = replies[3 * n: 3 * n + 3]
        if alive:
            entries += _entries(identity, work or work_6_4, config)
    return entries


def _entries(identity: str, flat: Any, config: Config) -> list[WorkEntry]:
    out = []
    for thread, value in hash_items(flat):
        work = Work.parse(value, config)
        if work is not None:
            out.append(WorkEntry(identity, text(thread), work))
    return out


def _busy_total(conn: Conn) -> int:
    identities = sscan_all(conn, keys.PROCESSES)
    busy = conn.pipeline([("HGET", identity, "busy") for identity in identities])
    return sum(to_int(b) for b in busy)

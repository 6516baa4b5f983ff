"""Unique-job locks as an operator reads them (Sidekiq Enterprise's ``Unique.locked?``).

Duties:
1. ``holder``: the jid holding the lock of a job (class, arguments, queue),
   the key made as a push makes it (a ``unique_key`` function this process
   registered included), or None when no lock is held.
2. ``locks``: the locks in Redis (a bounded SCAN of ``unique:*``), each with
   its holder and the milliseconds it has left; a value that is not a
   string reads as ``""``.
3. ``release`` (by class, arguments and queue) and ``release_key`` (a key
   as ``locks`` lists it): drop one lock by hand, whoever holds it, so a
   duplicate may be pushed now (an operator's override; workers release
   theirs by compare-and-delete).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.unique.keys import PREFIX
from wurk.unique.push import key_for
from wurk.wire.replies import resolve, text

MAX_SCAN = 10_000


@dataclass(frozen=True)
class UniqueLock:
    key: str
    holder: str  # the jid; "" when the value is not a string
    ttl_ms: int  # -1: no TTL (a push that meets it gives it one)


class UniqueLocks:
    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def key(self, job_class: str, args: Sequence[Any], queue: str = "default") -> str:
        return key_for({"class": job_class, "queue": queue, "args": list(args)})

    def holder(self, job_class: str, args: Sequence[Any], queue: str = "default") -> str | None:
        lock = self.read(self.key(job_class, args, queue))
        return None if lock is None else lock.holder

    def read(self, key: str) -> UniqueLock | None:
        pool = self.runtime.pool
        kind, ttl = pool.pipeline([("TYPE", key), ("PTTL", key)], idempotent=True)
        if text(kind) == "none":
            return None
        # GET on a key of another type is an error: such a lock has no holder.
        holder = text(pool.call("GET", key, idempotent=True)) if text(kind) == "string" else ""
        return UniqueLock(key, holder, ttl if isinstance(ttl, int) else -1)

    def locks(self, limit: int = 100) -> list[UniqueLock]:
        pool = self.runtime.pool
        found: list[UniqueLock] = []
        cursor, scanned = 0, 0
        while len(found) < limit and scanned < MAX_SCAN:
            cursor, batch = pool.call("SCAN", cursor, "MATCH", f"{PREFIX}*", "COUNT", 500,
                                      idempotent=True)
            scanned += 500
            for key in batch:
                lock = self.read(text(key))
                if lock is not None and len(found) < limit:
                    found.append(lock)
            if int(cursor) == 0:
                break
        return sorted(found, key=lambda lock: lock.key)

    def release(self, job_class: str, args: Sequence[Any], queue: str = "default") -> bool:
        """Drop the lock whoever holds it; True when there was one. Safe to replay."""
        key = self.key(job_class, args, queue)
        return bool(self.runtime.pool.call("DEL", key, idempotent=True))

    def release_key(self, key: str) -> bool:
        """Drop the lock at ``key`` (a ``unique:`` key); True when there was one. Safe to replay."""
        if not key.startswith(PREFIX) or len(key) > 1024:
            raise ValueError(f"not a unique lock key: {key[:80]!r}")
        return bool(self.runtime.pool.call("DEL", key, idempotent=True))

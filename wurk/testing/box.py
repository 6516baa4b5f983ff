"""The testing mode's memory: what a faked Redis would hold, and views of it.

Duties:
1. :class:`FakeJob`: one collected push, decoded from the very text a real
   push would have written (so a test sees the payload a worker would).
2. :class:`Box`: the jobs pushed and not yet run (in push order), the retry
   and dead entries their runs left, the unique locks their pushes took and
   the results their runs stored; all of it behind one lock, since a job's
   code may push from any thread.
3. The lookups a test asks for: the jobs of one queue, of one job.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from wurk.push.confirmed import QueuedJob
from wurk.unique import keys as unique


@dataclass(frozen=True)
class FakeJob:
    """A job as a push would have written it: ``payload`` is its decoded JSON."""

    payload: dict[str, Any]
    raw: str
    at: float | None = None  # when a scheduled job (perform_in/perform_at) was due
    # For an entry in ``dead``: the exception the job's last run raised.
    error: BaseException | None = field(default=None, compare=False)

    @classmethod
    def of(cls, queued: QueuedJob) -> FakeJob:
        return cls(json.loads(queued.raw), queued.raw, queued.run_at)

    @classmethod
    def entry(cls, raw: str | bytes, at: float | None = None,
              error: BaseException | None = None) -> FakeJob:
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "surrogatepass")
        try:
            payload = json.loads(text)
        except ValueError:
            payload = {}
        return cls(payload if isinstance(payload, dict) else {}, text, at, error)

    @property
    def jid(self) -> str:
        return str(self.payload.get("jid", ""))

    @property
    def queue(self) -> str:
        return str(self.payload.get("queue", "default"))

    @property
    def job_class(self) -> str:
        return str(self.payload.get("class", ""))

    @property
    def args(self) -> list[Any]:
        args = self.payload.get("args", [])
        return list(args) if isinstance(args, list) else []


def job_name(job: Any) -> str:
    """The wire name of an ``@wurk.job`` function, a ``wurk.Job`` class, an
    enqueuer (``job.set(...)``) or a name."""
    if isinstance(job, str):
        return job
    name = getattr(job, "wurk_name", None) or getattr(job, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"expected a job (an @wurk.job function, a wurk.Job class) or its "
                        f"name, got {job!r}")
    return name


class Box:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[FakeJob] = []
        self.retries: list[FakeJob] = []
        self.dead: list[FakeJob] = []
        # Unique lock key -> (holder's jid, when it expires).
        self.locks: dict[str, tuple[str, float]] = {}
        self.results: dict[str, Any] = {}
        # A callable the inline mode sets: each pushed job runs at once.
        self.on_push: Callable[[FakeJob], None] | None = None

    def add(self, queued: Iterable[QueuedJob]) -> None:
        jobs = [FakeJob.of(one) for one in queued]
        if self.on_push is not None:
            for job in jobs:
                self.on_push(job)
            return
        with self.lock:
            self.pending.extend(jobs)

    def take(self, queue: str | None) -> FakeJob | None:
        """The oldest job to run next (of ``queue``, if named); retries once no
        pushed job is left."""
        with self.lock:
            for jobs in (self.pending, self.retries):
                for i, job in enumerate(jobs):
                    if queue is None or job.queue == queue:
                        return jobs.pop(i)
        return None

    def clear(self) -> None:
        with self.lock:
            for kept in (self.pending, self.retries, self.dead):
                kept.clear()
            self.locks.clear()
            self.results.clear()

    # -- unique locks -----------------------------------------------------
    def lock_held(self, key: str, jid: str, ttl: float, now: float) -> bool:
        """Take ``key`` for ``jid``; True when another live jid holds it."""
        with self.lock:
            holder = self.locks.get(key)
            if holder is not None and holder[0] != jid and holder[1] > now:
                return True
            self.locks[key] = (jid, now + ttl)
            return False

    def release(self, job: dict[str, Any]) -> None:
        key, jid = unique.lock_of(job), job.get("jid")
        with self.lock:
            if key is not None and self.locks.get(key, ("", 0.0))[0] == jid:
                del self.locks[key]

    def held(self) -> dict[str, str]:
        """Each live lock's key and holder."""
        now = time.time()
        with self.lock:
            return {key: jid for key, (jid, until) in self.locks.items() if until > now}

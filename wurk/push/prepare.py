"""Payload building shared by the sync and the async client: pure, no I/O.

Duties:
1. Turn a ``push_job`` call (name, args, options, delay or time) into the
   item ``push`` takes, with Sidekiq's perform_in rule.
2. ``normalise`` an item into the payload written and its run time, refusing
   what no worker could read (class, args, queue, ``at``).
3. Check a ``push_bulk`` item whole before anything is written, and cut it
   into the per-job items of each thousand-job slice.
4. Run the client middleware chain on a normalised payload and check again
   what it returns; a push a middleware deferred gives its jid, and a bulk
   slice keeps deferred jids in their place (:class:`BulkSlice`).
5. Serialise a batch into the jobs of one push, and the commands of a plain
   (unconfirmed) write with its apply-safety: only a ZADD of exact members
   may be sent twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wurk.push import middleware, signatures
from wurk.push.confirmed import ConfirmedPush, QueuedJob
from wurk.push.time_options import stamp_expiry
from wurk.settings.hooks import ClientMiddleware
from wurk.wire import keys
from wurk.wire.payload import ArgumentError, check_args, dumps, new_jid, now_stamp, score

if TYPE_CHECKING:
    from wurk.push.options import JobOptions

# Sidekiq's rule: a perform_in interval below this is relative, above it absolute.
ABSOLUTE_THRESHOLD = 1_000_000_000
BULK_BATCH = 1000
Prepared = tuple[dict[str, Any], "float | None"]


def job_item(name: str, args: list[Any], options: JobOptions, *,
             delay: float | None = None, at: float | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {**options.payload_fields(), "class": name, "args": args}
    if delay is not None:
        # Sidekiq's perform_in rule: under 1e9 an interval, else an epoch.
        seconds = float(delay)
        item["at"] = seconds if seconds >= ABSOLUTE_THRESHOLD else time.time() + seconds
    elif at is not None:
        item["at"] = at
    return item


def normalise(item: Mapping[str, Any], now: float, timestamps: str, *,
              checked: bool = False) -> Prepared:
    """``checked``: the args were already checked (a bulk push checks them whole)."""
    cls = item.get("class")
    if not isinstance(cls, str) or not cls:
        raise TypeError(f"job 'class' must be a non-empty string, got {cls!r}")
    args = item.get("args", [])
    if not isinstance(args, list):
        raise TypeError(f"job 'args' must be a list, got {type(args).__name__}")
    if not checked:
        check_args(args)
    queue = item.get("queue", "default")
    if not isinstance(queue, str) or not queue:
        raise TypeError(f"job 'queue' must be a non-empty string, got {queue!r}")
    payload: dict[str, Any] = {"retry": True, "queue": queue}
    payload.update((k, v) for k, v in item.items() if k != "at")
    payload.setdefault("jid", new_jid())
    payload.setdefault("created_at", now_stamp(timestamps, now))
    run_at = run_time(item.get("at"), now)
    stamp_expiry(payload, run_at, now)
    if run_at is None:
        payload["enqueued_at"] = now_stamp(timestamps, now)
    else:
        payload.pop("enqueued_at", None)
    return payload, run_at


def run_time(at: Any, now: float) -> float | None:
    if at is None:
        return None
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise TypeError(f"job 'at' must be epoch seconds, got {at!r}")
    # As Sidekiq's raw push: ``at`` is an epoch time; one already past runs now.
    return float(at) if at > now else None


def through_middleware(chain: Sequence[ClientMiddleware], prepared: Prepared, now: float,
                       timestamps: str, redis: Any, *,
                       resume: Callable[[dict[str, Any]], object]) -> Prepared | str | None:
    """Run the client middleware (if any) on a normalised payload: None when
    one stopped the push, the jid when one deferred it (``middleware.defer``:
    ``resume(payload)`` pushes it later), else the payload checked again as a
    push would be."""
    if not chain:
        return prepared
    payload, run_at = prepared
    if run_at is not None:
        payload["at"] = run_at  # as Sidekiq's middleware sees a scheduled job
    outcome = middleware.run(chain, payload, redis, lambda: resume(payload))
    if outcome != "write":
        return str(payload["jid"]) if outcome == "defer" else None
    # A middleware may have changed anything, ``at`` and ``args`` included.
    return normalise(payload, now, timestamps)


def bulk_slices(item: Mapping[str, Any], now: float,
                timestamps: str) -> Iterator[list[dict[str, Any]]]:
    """Check a ``push_bulk`` item whole (a bad job pushes nothing), then yield
    the per-job items of each slice of :data:`BULK_BATCH`."""
    all_args, ats = check_bulk(item)
    return _slices(item, all_args, ats, now_stamp(timestamps, now))


def check_bulk(item: Mapping[str, Any]) -> tuple[list[list[Any]], Any]:
    """A ``push_bulk`` item's argument lists and ``at``, every job checked."""
    all_args = item.get("args")
    if not isinstance(all_args, list) or not all(isinstance(a, list) for a in all_args):
        raise TypeError("push_bulk needs 'args' as a list of argument lists")
    ats = item.get("at")
    if isinstance(ats, list) and len(ats) != len(all_args):
        raise ValueError("push_bulk 'at' list must have one time per job")
    name = str(item.get("class"))
    for i, args in enumerate(all_args):
        try:
            check_args(args)
            signatures.check(name, args)
        except ArgumentError:
            # Checked again to name the job in the message: building that
            # name for every job cost as much as the checks.
            check_args(args, f"args[{i}]")
            signatures.check(name, args, f" in args[{i}]")
            raise
    return all_args, ats


def bulk_shared(item: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every job of a ``push_bulk`` item shares."""
    return {k: v for k, v in item.items() if k not in ("args", "at", "jid")}


def bulk_item(shared: dict[str, Any], args: list[Any], at: Any,
              created: Any) -> dict[str, Any]:
    """One job's item of a bulk push (``at``: its own time, or None)."""
    one = {**shared, "args": args}
    if at is not None:
        one["at"] = at
    one.setdefault("created_at", created)
    return one


def _slices(item: Mapping[str, Any], all_args: list[list[Any]], ats: Any,
            created: Any) -> Iterator[list[dict[str, Any]]]:
    shared = bulk_shared(item)
    for start in range(0, len(all_args), BULK_BATCH):
        yield [bulk_item(shared, all_args[i], ats[i] if isinstance(ats, list) else ats, created)
               for i in range(start, min(start + BULK_BATCH, len(all_args)))]


class BulkSlice:
    """One bulk slice on its way: the payloads to write, and every jid in
    item order, a deferred push's included (it is written later)."""

    def __init__(self) -> None:
        self.batch: list[Prepared] = []
        self._order: list[str] = []
        self._deferred: set[str] = set()

    def add(self, routed: Prepared | str | None) -> None:
        if isinstance(routed, tuple):
            self.batch.append(routed)
            self._order.append(str(routed[0]["jid"]))
        elif routed is not None:
            self._order.append(routed)
            self._deferred.add(routed)

    def jids(self, written: Sequence[Prepared]) -> list[str]:
        """The slice's jids in order: those written (``written``) and the deferred."""
        kept = self._deferred | {str(p["jid"]) for p, _ in written}
        return [jid for jid in self._order if jid in kept]


def as_push(batch: Sequence[Prepared]) -> ConfirmedPush:
    return ConfirmedPush(tuple(QueuedJob(str(p["jid"]), p["queue"], dumps(p), run_at)
                               for p, run_at in batch))


def plain_commands(content: ConfirmedPush) -> tuple[list[tuple[Any, ...]], bool]:
    """The commands of an unconfirmed write, and whether sending them twice is safe."""
    immediate: dict[str, list[str]] = {}
    scheduled: list[str] = []
    for job in content.jobs:
        if job.run_at is None:
            immediate.setdefault(job.queue, []).append(job.raw)
        else:
            scheduled.extend((score(job.run_at), job.raw))
    commands: list[tuple[Any, ...]] = []
    if immediate:
        commands.append(("SADD", keys.QUEUES, *immediate))
        commands.extend(("LPUSH", keys.queue(q), *jobs) for q, jobs in immediate.items())
    if scheduled:
        commands.append(("ZADD", keys.SCHEDULE, *scheduled))
    # Only a ZADD of exact members is safe to send twice.
    return commands, not immediate

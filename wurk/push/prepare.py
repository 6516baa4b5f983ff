"""The push pipeline's first stage, normalise, shared by both clients: pure, no I/O.

Duties:
1. Turn a ``push_job`` call (name, args, options, delay or time) into the
   item ``push`` takes, with Sidekiq's perform_in rule.
2. ``normalise`` an item into the payload written and its run time, refusing
   what no worker could read (class, args, queue, ``at``, a keywords marker
   with no keywords: :mod:`wurk.wire.keywords`). A time is epoch
   seconds, finite and within :data:`~wurk.push.time_options.MAX_EPOCH` of
   zero (:func:`epoch_seconds`): infinity, NaN, a bool, a string or a year
   past 5138 is a :class:`wurk.ArgumentError`, never a score in Redis.
3. Check a ``push_bulk`` item whole before anything is written, and cut it
   into the per-job items of each thousand-job slice.
4. Keep a bulk slice's jids in item order, a deferred push's in its place
   (:class:`BulkSlice`); the chain itself runs in :mod:`wurk.push.pipeline`.
5. Serialise a batch into the jobs of one push (written by
   :mod:`wurk.push.landing` or :mod:`wurk.push.confirmed`). A payload no
   worker could write back (a lone surrogate in its class, queue, jid, args
   or any field, keys included) is refused with
   :class:`~wurk.wire.payload.ArgumentError` before anything is sent;
   checking costs an ASCII test of the text in the common case.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wurk.core.validate import is_number
from wurk.push import signatures
from wurk.push.confirmed import ConfirmedPush, QueuedJob
from wurk.push.time_options import MAX_EPOCH, stamp_expiry
from wurk.wire import keywords
from wurk.wire.payload import (
    ArgumentError,
    check_args,
    dumps,
    new_jid,
    now_stamp,
    unwritable_field,
    writable,
)

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
        seconds = epoch_seconds(delay, "perform_in's interval")
        item["at"] = seconds if seconds >= ABSOLUTE_THRESHOLD else time.time() + seconds
    elif at is not None:
        item["at"] = at
    return item


def normalise(item: Mapping[str, Any], now: float, timestamps: str, *,
              checked: bool = False) -> Prepared:
    """``checked``: the args were already checked (a bulk push checks them whole,
    its keywords marker included)."""
    cls = item.get("class")
    if not isinstance(cls, str) or not cls:
        raise TypeError(f"job 'class' must be a non-empty string, got {cls!r}")
    args = item.get("args", [])
    if not isinstance(args, list):
        raise TypeError(f"job 'args' must be a list, got {type(args).__name__}")
    if not checked:
        check_args(args)
        if keywords.MARKER in item and (reason := keywords.problem(item)) is not None:
            raise ArgumentError(reason)
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
    seconds = epoch_seconds(at)
    # As Sidekiq's raw push: ``at`` is an epoch time; one already past runs now.
    return seconds if seconds > now else None


def epoch_seconds(value: Any, what: str = "job 'at'") -> float:
    """``value`` as finite seconds within ``MAX_EPOCH`` of zero, else ArgumentError.

    The one check every push's time passes: a sorted-set score of ``inf`` or
    1e300 is one no listing, dashboard or poller can turn back into a time.
    """
    if not is_number(value):
        raise ArgumentError(f"{what} must be epoch seconds, got {value!r:.60}")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) >= MAX_EPOCH:
        raise ArgumentError(f"{what} must be finite and below {MAX_EPOCH:.0f} seconds, "
                            f"got {value!r:.60}")
    return float(value)


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
    for i, at in enumerate(ats if isinstance(ats, list) else [ats]):
        if at is not None:
            epoch_seconds(at, f"push_bulk 'at[{i}]'" if isinstance(ats, list) else "push_bulk 'at'")
    name = str(item.get("class"))
    keyed = keywords.marked(item)
    for i, args in enumerate(all_args):
        try:
            check_args(args)
            _fits(name, args, keyed, "")
        except ArgumentError:
            # Checked again to name the job in the message: building that
            # name for every job cost as much as the checks.
            check_args(args, f"args[{i}]")
            _fits(name, args, keyed, f" in args[{i}]")
            raise
    return all_args, ats


def _fits(name: str, args: list[Any], keyed: bool, where: str) -> None:
    """``args`` fit the job; ``keyed``: the last of them is its keywords."""
    if not keyed:
        signatures.check(name, args, where)
    elif args and isinstance(args[-1], dict):
        signatures.check(name, args[:-1], where, args[-1])
    else:
        raise ArgumentError(f"'{keywords.MARKER}' is true but the last argument{where} "
                            "is not an object of keywords")


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
    return ConfirmedPush(tuple(QueuedJob(str(p["jid"]), p["queue"], serialised(p), run_at)
                               for p, run_at in batch))


def serialised(payload: dict[str, Any]) -> str:
    """The payload's text; ArgumentError when UTF-8 cannot carry it."""
    text = dumps(payload)
    if not writable(text):
        refuse_unwritable(payload)
    return text


def refuse_unwritable(payload: dict[str, Any]) -> None:
    where = unwritable_field(payload) or "a field"
    raise ArgumentError(f"job {where} holds a lone surrogate, which UTF-8 cannot carry "
                        "(a surrogate-escaped file name? decode it first)")


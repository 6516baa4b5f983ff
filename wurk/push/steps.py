"""The push pipeline's built-in steps: what wurk itself does to a push after
the application's chain and before the write.

A built-in step is a small object with a payload ``field`` it acts on and
two plain functions, neither of which does I/O: ``admit`` looks at the
payloads of a push (one job, or a bulk slice of up to a thousand) that
carry its field and asks Redis one question for all of them
(:class:`~wurk.push.exchange.Ask`: the commands, and how their replies
decide each payload); ``give_back`` gives the trip that returns what the
step took for payloads that were then not written. The clients send both on
their own pools (:mod:`wurk.push.exchange`).

They run in this order, each only on the payloads that carry its field:
the unique lock (:class:`~wurk.unique.push.UniqueLock`, on ``unique_for``),
so it is taken on the arguments as they will be written; then the batch
count (:class:`~wurk.batches.push.BatchCount`, on ``bid``), so a
duplicate the lock refused is never counted. A client that writes plainly
counts batch jobs in the write itself (one script, no window) and skips
that step. A payload without any step's field costs a dict lookup per step.

Duties:
1. ``admit``: the flow of the steps over a push; the payloads they let through.
2. ``give_back``: the flow that gives back what the steps took for payloads
   that were not written. When the write's outcome is unknown
   (:func:`outcome_unknown`: the connection broke after sending) the jobs may
   have landed: nothing is given back (a lock then expires on its own, a
   batch stays pending until the job runs), and it is logged. A give-back
   that fails is logged, never raised: the push is already failing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from wurk.batches.keys import FIELD as BATCH_FIELD
from wurk.batches.push import BatchCount
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push import landing
from wurk.push.confirmed import PushNotConfirmedError
from wurk.push.exchange import Ask, Flow, Trip
from wurk.unique.push import UniqueLock

log = get_logger("wurk.client")
Prepared = tuple[dict[str, Any], "float | None"]


class Step(Protocol):
    """A built-in step of the push pipeline: decisions and commands, no I/O."""

    @property
    def field(self) -> str: ...  # a payload carrying this field goes through this step
    def admit(self, batch: Sequence[Prepared]) -> Ask | None: ...  # None: nothing to ask
    def give_back(self, payloads: Iterable[dict[str, Any]]) -> Trip | None: ...


BUILT_IN: tuple[Step, ...] = (UniqueLock(), BatchCount())


def admit(batch: list[Prepared], skip: Sequence[str] = ()) -> Flow[list[Prepared]]:
    """The payloads of ``batch`` the built-in steps let through, in order.
    The steps whose field is in ``skip`` do not run."""
    for step in BUILT_IN:
        mine = [] if step.field in skip else _carrying(batch, step.field)
        if not mine:
            continue
        ask = step.admit([batch[i] for i in mine])
        if ask is not None:
            batch = _without_refused(batch, mine, ask.decide((yield ask.trip)))
    return batch


def _carrying(batch: list[Prepared], field: str) -> list[int]:
    for payload, _ in batch:
        if field in payload:
            break
    else:
        return []  # the whole cost of a step no payload asks for
    return [i for i, (payload, _) in enumerate(batch) if field in payload]


def _without_refused(batch: list[Prepared], mine: list[int],
                     verdicts: list[bool]) -> list[Prepared]:
    refused = {i for i, ok in zip(mine, verdicts, strict=True) if not ok}
    return [job for i, job in enumerate(batch) if i not in refused] if refused else batch


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` may have landed: the connection broke
    after sending (or the process was interrupted mid-write), or a confirmed
    write reached the primary but not its replicas."""
    return isinstance(exc, PushNotConfirmedError) or landing.outcome_unknown(exc)


def give_back(payloads: Iterable[dict[str, Any]], skip: Sequence[str] = (),
              written_error: BaseException | None = None) -> Flow[None]:
    """Give back what the steps took for ``payloads``, which were not written.
    ``written_error``: the write itself failed with it; when its outcome is
    unknown, nothing is given back. The steps whose field is in ``skip`` took
    nothing."""
    payloads = list(payloads)
    if _kept(payloads, written_error):
        return
    for step, mine in _taken(payloads, skip):
        trip = step.give_back(mine)
        if trip is None:
            continue
        try:
            yield trip
        except Exception as exc:  # noqa: BLE001 - what was taken expires on its own
            log.warning("client.give_back_failed", jids=[p.get("jid") for p in mine][:10],
                        field=step.field, error=describe(exc))


def _kept(payloads: list[dict[str, Any]], error: BaseException | None) -> bool:
    """True (and logged) when the write failed with ``error`` and may have landed."""
    if error is None or not outcome_unknown(error):
        return False
    log.warning("client.write_outcome_unknown", jids=[p.get("jid") for p in payloads][:10],
                count=len(payloads), error=describe(error),
                bids=sorted({str(p[BATCH_FIELD]) for p in payloads if BATCH_FIELD in p})[:10],
                kept="unique locks and batch counts (the jobs may have landed)")
    return True


def _taken(payloads: list[dict[str, Any]],
           skip: Sequence[str]) -> Iterator[tuple[Step, list[dict[str, Any]]]]:
    """Each step with the payloads that carry its field (skipping those with none)."""
    for step in BUILT_IN:
        if step.field in skip:
            continue
        mine = [payload for payload in payloads if step.field in payload]
        if mine:
            yield step, mine

"""Batches, client side: the built-in push step that counts a job into its batch.

A payload carrying ``bid`` (written by :class:`wurk.push.batch.Batch`) goes
through this step after the application's client middleware, just before
the write (:mod:`wurk.push.middleware`). The step adds the jobs' jids to
``b-<bid>-jids`` and raises ``total`` and ``pending`` (Lua ``batch_add``)
*before* the jobs are written: a job can therefore never run, succeed and
be uncounted before it was counted, so no batch completes early. Sidekiq
Pro does the count and the push in one MULTI; here the count comes first,
and a push that then fails is uncounted (``give_back``). One round trip per
batch id in a push or a bulk slice of a thousand jobs.

Duties:
1. ``admit``: count every job of the slice into its batch, one script call
   per batch id; a batch that already succeeded, or (for a push made by
   ``wurk.Batch``) has no record, fails the push with :class:`BatchError`
   and nothing of it written. A raw push whose ``bid`` names no batch
   record goes through uncounted (a Sidekiq Pro bid, a copied payload).
2. ``give_back``: uncount jobs that were counted but not written.
3. Turn the scripts' ``WURKBATCH`` error replies into :class:`BatchError`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.wire import batch
from wurk.wire.batch_lua import ADD, REMOVE
from wurk.wire.lua import Script

log = get_logger("wurk.batch")
# True while wurk.Batch pushes: its batch must exist. A raw push of a payload
# whose bid names no batch record (a Sidekiq Pro batch, a copied payload)
# goes through uncounted, with a warning.
STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("wurk_batch_strict",
                                                              default=False)


class BatchError(RuntimeError):
    """A batch cannot do what was asked (gone, finished, bad state in Redis)."""


def run(redis: Any, script: Script, args: list[Any]) -> Any:
    """Run a batch script, idempotent by construction; its refusals as BatchError."""
    try:
        return redis.run(lambda c: script.run(c, [], args), idempotent=True)
    except rx.ResponseError as exc:
        text = str(exc)
        if "WURKBATCH" in text:
            raise BatchError(text.split("WURKBATCH", 1)[1].strip()) from None
        raise


def _by_bid(payloads: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for payload in payloads:
        bid = payload.get(batch.FIELD)
        if bid is None:
            continue
        if not batch.valid_bid(bid):
            raise BatchError(f"a job's 'bid' must be a string of 1 to {batch.MAX_BID} "
                             f"characters, got {bid!r}; nothing was pushed")
        groups.setdefault(bid, []).append(str(payload["jid"]))
    return groups


def admit(slice_: Sequence[tuple[dict[str, Any], float | None]], redis: Any) -> list[bool]:
    """The built-in step: count the jobs of ``slice_`` into their batches."""
    # A refusal raises: the client then gives back what earlier batch ids counted.
    strict = "1" if STRICT.get() else "0"
    for bid, jids in _by_bid(payload for payload, _ in slice_).items():
        if run(redis, ADD, [bid, strict, *jids]) == -1:
            log.warning("batch.unknown_bid", bid=bid, jids=jids[:10], count=len(jids))
    return [True] * len(slice_)


def give_back(payloads: Iterable[Mapping[str, Any]], redis: Any) -> int:
    """Uncount jobs that were counted but not written; how many were."""
    return sum(_remove(redis, bid, jids) for bid, jids in _by_bid(payloads).items())


def _remove(redis: Any, bid: str, members: list[str]) -> int:
    return int(run(redis, REMOVE, [bid, *members]))

"""Batches, client side: counting a job into its batch as it is written.

A payload carrying ``bid`` (written by :class:`wurk.push.batch.Batch`) adds
its jid to ``b-<bid>-jids`` and raises ``total`` and ``pending``. A client
that writes plainly (no push buffer, no replica confirmation) does the
count and the write in one script (``write``/``awrite``, Lua
``batch_push``), as Sidekiq Pro does in one MULTI: a lost reply or a
killed client leaves both or neither, so no window exists. One round trip
for a push, or for a bulk slice of a thousand jobs, as without a batch.

A buffered or replica-confirmed client keeps its own write (the buffer may
hold and spool it; the confirmed write is sent again until replicas agree),
so for those this module is a built-in push step (:mod:`wurk.push.middleware`)
that counts first (Lua ``batch_add``, one more round trip per batch id):
a job can never run and be uncounted, so no batch completes early. A write
that then provably did not land (refused, or failed before it was sent) is
uncounted (``give_back``); one whose outcome is unknown keeps its count (the
middleware says which), and the batch stays pending until that job runs.

Duties:
1. ``write``/``awrite``: count and write in one script; a batch that
   already succeeded, or (for a push made by ``wurk.Batch``) has no record,
   refuses the whole write with :class:`BatchError` and nothing written. A
   raw push whose ``bid`` names no batch record goes through uncounted (a
   Sidekiq Pro bid, a copied payload), with a warning.
2. ``admit``: the count-first step of the other write paths, with the same
   refusals; one script call per batch id.
3. ``give_back``: uncount jobs that were counted but provably not written.
4. Turn the scripts' ``WURKBATCH`` error replies into :class:`BatchError`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.push.confirmed import ConfirmedPush
from wurk.wire import batch
from wurk.wire.batch_lua import ADD, REMOVE
from wurk.wire.batch_push_lua import PUSH, write_args
from wurk.wire.lua import Script
from wurk.wire.payload import score

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
        raise refusal(exc) from None


def refusal(exc: rx.ResponseError) -> Exception:
    """A script's ``WURKBATCH`` error reply as a BatchError; any other as it is."""
    text = str(exc)
    if "WURKBATCH" in text:
        return BatchError(text.split("WURKBATCH", 1)[1].strip())
    return exc


def write_tail(content: ConfirmedPush) -> tuple[list[Any], bool]:
    """The write tail of Lua ``batch_push``/``batch_launch`` for ``content``, and
    whether sending it twice is safe (only scheduled jobs: a ZADD of exact members)."""
    immediate: dict[str, list[str]] = {}
    scheduled: list[tuple[str, str]] = []
    for job in content.jobs:
        if job.run_at is None:
            immediate.setdefault(job.queue, []).append(job.raw)
        else:
            scheduled.append((score(job.run_at), job.raw))
    return write_args(immediate, scheduled), not immediate


def push_args(content: ConfirmedPush,
              payloads: Iterable[Mapping[str, Any]]) -> tuple[list[Any], bool]:
    """The arguments of Lua ``batch_push`` for ``content``, and whether it may be replayed."""
    args: list[Any] = ["1" if STRICT.get() else "0"]
    groups = _by_bid(payloads)
    args.append(len(groups))
    for bid, jids in groups.items():
        args += [bid, len(jids), *jids]
    tail, idempotent = write_tail(content)
    return args + tail, idempotent


def write(content: ConfirmedPush, payloads: Iterable[Mapping[str, Any]], redis: Any, *,
          attempts: int | None = None) -> None:
    """Count and write ``content`` (made of ``payloads``) in one script: the plain write."""
    args, idempotent = push_args(content, payloads)
    try:
        unknown = redis.run(lambda c: PUSH.run(c, [], args), idempotent=idempotent,
                            attempts=attempts)
    except rx.ResponseError as exc:
        raise refusal(exc) from None
    _warn_unknown(unknown, content)


async def awrite(content: ConfirmedPush, payloads: Iterable[Mapping[str, Any]], redis: Any, *,
                 attempts: int | None = None) -> None:
    """:func:`write` on the asyncio pool."""
    args, idempotent = push_args(content, payloads)
    try:
        unknown = await redis.run(lambda c: c.script(PUSH, [], args), idempotent=idempotent,
                                  attempts=attempts)
    except rx.ResponseError as exc:
        raise refusal(exc) from None
    _warn_unknown(unknown, content)


def _warn_unknown(unknown: Any, content: ConfirmedPush) -> None:
    for bid in unknown or []:
        text = bid.decode() if isinstance(bid, bytes) else str(bid)
        log.warning("batch.unknown_bid", bid=text, count=len(content.jobs))


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

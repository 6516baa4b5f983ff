"""Batches, client side: counting a job into its batch as it is written.

A payload carrying ``bid`` (written by :class:`wurk.batches.client.Batch`) adds
its jid to ``b-<bid>-jids`` and raises ``total`` and ``pending``. A client
that writes plainly (no push buffer, no replica confirmation) does the
count and the write in one script (``write_flow``, Lua ``batch_push``), as
Sidekiq Pro does in one MULTI: a lost reply or a killed client leaves both
or neither, so no window exists. One round trip for a push, or for a bulk
slice of a thousand jobs, as without a batch.

A buffered or replica-confirmed client keeps its own write (the buffer may
hold and spool it; the confirmed write is sent again until replicas agree),
so for those this module is a built-in step of the push pipeline
(:class:`BatchCount`, run by :mod:`wurk.push.steps`) that counts first (Lua
``batch_add``, one round trip for every batch id of the push): a job can
never run and be uncounted, so no batch completes early. A write that then
provably did not land (refused, or failed before it was sent) is uncounted
(``give_back``); one whose outcome is unknown keeps its count (the pipeline
says which), and the batch stays pending until that job runs.

Nothing here waits on Redis but ``run`` and ``write``: the step and the
write are data (:mod:`wurk.push.exchange`) that each client sends on its pool.

Duties:
1. ``write_flow``: count and write in one script; a batch that already
   succeeded, or (for a push made by ``wurk.Batch``) has no record, refuses
   the whole write with :class:`BatchError` and nothing written. A raw push
   whose ``bid`` names no batch record goes through uncounted (a Sidekiq
   Pro bid, a copied payload), with a warning.
2. :class:`BatchCount`: the count-first step of the other write paths, with
   the same refusals, and its ``give_back``: uncount jobs that were counted
   but provably not written.
3. Turn the scripts' ``WURKBATCH`` error replies into :class:`BatchError`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.batches import keys as batch
from wurk.batches.lua import ADD, REMOVE
from wurk.batches.push_lua import PUSH, write_args
from wurk.core.logging import get_logger
from wurk.push.confirmed import ConfirmedPush
from wurk.push.exchange import Ask, Commands, Flow, Trip, drive
from wurk.wire.lua import Script
from wurk.wire.payload import score

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool

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


def write_flow(content: ConfirmedPush, payloads: Iterable[Mapping[str, Any]], *,
               attempts: int | None = None) -> Flow[None]:
    """Count and write ``content`` (made of ``payloads``) in one script: the plain write."""
    args, idempotent = push_args(content, payloads)
    replies = yield Commands((("EVALSHA", PUSH.sha, 0, *args),), idempotent=idempotent,
                             scripts=(PUSH,), attempts=attempts, refuse=refusal)
    _warn_unknown(replies[0], content)


def write(content: ConfirmedPush, payloads: Iterable[Mapping[str, Any]], redis: RedisPool,
          *, attempts: int | None = None) -> None:
    """:func:`write_flow` on the sync pool."""
    drive(redis, write_flow(content, payloads, attempts=attempts))


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


class BatchCount:
    """The built-in step of the writes that cannot count in the same script."""

    field = batch.FIELD

    def admit(self, slice_: Sequence[tuple[dict[str, Any], float | None]]) -> Ask | None:
        """Count the jobs of ``slice_`` into their batches: one script call per
        batch id, all in one round trip. A refusal raises: the client then
        gives back what the other batch ids counted."""
        strict = "1" if STRICT.get() else "0"
        groups = _by_bid(payload for payload, _ in slice_)
        if not groups:
            return None
        trip = Commands(tuple(("EVALSHA", ADD.sha, 0, bid, strict, *jids)
                              for bid, jids in groups.items()),
                        scripts=(ADD,), refuse=refusal)
        return Ask(trip, lambda replies: _counted(groups, replies, len(slice_)))

    def give_back(self, payloads: Iterable[Mapping[str, Any]]) -> Trip | None:
        """Uncount jobs that were counted but not written."""
        groups = _by_bid(payloads)
        if not groups:
            return None
        return Commands(tuple(("EVALSHA", REMOVE.sha, 0, bid, *jids)
                              for bid, jids in groups.items()),
                        scripts=(REMOVE,), refuse=refusal)


def _counted(groups: dict[str, list[str]], replies: list[Any], jobs: int) -> list[bool]:
    for (bid, jids), reply in zip(groups.items(), replies, strict=True):
        if reply == -1:
            log.warning("batch.unknown_bid", bid=bid, jids=jids[:10], count=len(jids))
    return [True] * jobs

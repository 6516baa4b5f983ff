"""Batches, worker side: tell a job's batch how the job ended.

A step on the job's lifecycle (:class:`BatchStep`); a job without ``bid``
never calls it in. For a batch job:

1. ``started``/``stopped``: while it runs, ``wurk.Batch.current()`` is its
   batch (a context variable), so jobs it adds count in the batch, and a
   batch it creates is a child of it.
2. A success, before the acknowledgement: the Lua ``batch_succeeded``
   removes the jid from ``b-<bid>-jids`` and lowers ``pending`` only if it
   was there, so a job run twice (reliable-fetch recovery after a SIGKILL
   between this and the ack) is counted once; the same call fires
   ``complete``/``success`` when they are due. Counted before the ack, so
   a crash in between runs the job again rather than losing the count.
3. A failure, before it is settled: records the jid and its
   error (class and message) in ``b-<bid>-failed``/``-failinfo``, which
   counts as "ran once" for ``complete``; a job that died (or was dropped
   by ``dead: false``) also fires ``death`` once. :func:`failure_info`
   is the error entry it records, shared with a person's delete or kill
   (:mod:`wurk.api.removal`).
Both are writes the job's settlement sends with its other steps' in one
round trip, retried through Redis trouble until they land or a hard stop
abandons the job (``wurk.runtime.lifecycle.writes``). A batch in a bad
state (garbage in Redis) is logged as ``batch.unrecorded`` and given up:
the job is still acknowledged.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.batches import keys as batch
from wurk.batches.client import RUNNING
from wurk.batches.lua import FAILED, SUCCEEDED
from wurk.batches.push import BatchError, refusal
from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import trouble_backoff
from wurk.runtime.lifecycle import writes
from wurk.runtime.lifecycle.step import Ending, Run, Step
from wurk.runtime.lifecycle.writes import Write
from wurk.runtime.retry import exception_message
from wurk.wire.lua import Script
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.core.backoff import Backoff
    from wurk.redis.runtime import Runtime
    from wurk.settings.config import Config

log = get_logger("wurk.batch")
Token = contextvars.Token[str | None]
Abandoned = Callable[[float], bool]


class BatchStep(Step):
    name = "batch"
    triggers = (batch.FIELD,)

    def __init__(self, config: Config) -> None:
        self.config = config

    def enter(self, run: Run) -> None:
        run.notes["batch"] = started(run.job)

    def exit(self, run: Run) -> None:
        stopped(run.notes.pop("batch", None))

    def concluding(self, run: Run, ending: Ending) -> list[Write]:
        if ending.failure is None:
            return success_writes(run.job)
        return failure_writes(run.job, ending.failure, ending.outcome)


def started(job: dict[str, Any]) -> Token | None:
    if batch.FIELD not in job:
        return None
    bid = batch.bid_of(job)
    if bid is None:
        log.warning("batch.bad_bid", jid=job.get("jid"), bid=repr(job.get(batch.FIELD))[:80])
        return None
    return RUNNING.set(bid)


def stopped(token: Token | None) -> None:
    if token is not None:
        RUNNING.reset(token)


def success_writes(job: dict[str, Any]) -> list[Write]:
    """The count of a success (a job run twice, after a recovery, counts once)."""
    bid = batch.bid_of(job) if batch.FIELD in job else None
    if bid is None:
        return []
    return [_write(SUCCEEDED, bid, [bid, str(job.get("jid"))])]


def failure_writes(job: dict[str, Any], exc: BaseException, outcome: str) -> list[Write]:
    """The record of a failure; ``outcome`` is where the job goes: retry, dead,
    dropped or cancelled (the last three are a death: it will not run again)."""
    bid = batch.bid_of(job) if batch.FIELD in job else None
    if bid is None:
        return []
    died = "1" if outcome in ("dead", "dropped", "cancelled") else "0"
    info = failure_info(job, type(exc).__name__, exception_message(exc))
    return [_write(FAILED, bid, [bid, str(job.get("jid")), info, died])]


def failure_info(job: dict[str, Any], error_class: str, message: str) -> str:
    """The ``b-<bid>-failinfo`` entry of a job's failure (the worker's, or a
    person's delete or kill: :mod:`wurk.api.removal`)."""
    try:
        return dumps({"class": error_class, "message": message[:1000],
                      "job": str(job.get("class"))[:200], "retry_count": job.get("retry_count")})
    except (TypeError, ValueError):  # a retry_count a middleware made unwritable
        return dumps({"class": error_class, "message": message[:1000]})


def succeeded(runtime: Runtime, job: dict[str, Any], abandoned: Abandoned) -> bool:
    """Count a success now; False when a hard stop abandoned the job before it could be."""
    return writes.send(runtime.pool, success_writes(job), abandoned, _backoff(runtime.config))


def failed(runtime: Runtime, job: dict[str, Any], exc: BaseException, outcome: str,
           abandoned: Abandoned) -> bool:
    """Record a failure now; False when a hard stop abandoned the job first (the
    settle that follows leaves the job to the recovery too)."""
    return writes.send(runtime.pool, failure_writes(job, exc, outcome), abandoned,
                       _backoff(runtime.config))


def _backoff(config: Config) -> Backoff:
    return trouble_backoff(config.redis_retry_base, config.redis_retry_cap)


def _write(script: Script, bid: str, args: list[Any]) -> Write:
    jid = args[1]

    def refused(exc: Exception, attempt: int) -> bool:
        if isinstance(exc, rx.ResponseError):
            exc = refusal(exc)
        if _hopeless(exc):
            log.error("batch.unrecorded", bid=bid, jid=jid, step=script.name, error=describe(exc))
            return False
        log.warning("batch.retrying", bid=bid, jid=jid, step=script.name, attempt=attempt,
                    error=describe(exc))
        return True

    def landed(reply: Any) -> None:
        if reply == -1:
            log.warning("batch.gone", bid=bid, jid=jid)

    return Write(script, (), args, refused=refused, landed=landed)


def _hopeless(exc: Exception) -> bool:
    """A refusal that the same call would meet again: bad state in Redis, not an outage."""
    if isinstance(exc, BatchError | ValueError | TypeError):
        return True
    text = str(exc)
    return isinstance(exc, rx.ResponseError) and (
        "WRONGTYPE" in text or "script" in text.lower())

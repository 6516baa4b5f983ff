"""Batches, worker side: tell a job's batch how the job ended.

The processor calls this module for every job; a job without ``bid`` costs
one dict lookup. For a batch job:

1. ``started``/``stopped``: while it runs, ``wurk.Batch.current()`` is its
   batch (a context variable), so jobs it adds count in the batch, and a
   batch it creates is a child of it.
2. ``succeeded``, before the acknowledgement: the Lua ``batch_succeeded``
   removes the jid from ``b-<bid>-jids`` and lowers ``pending`` only if it
   was there, so a job run twice (reliable-fetch recovery after a SIGKILL
   between this and the ack) is counted once; the same call fires
   ``complete``/``success`` when they are due. Counted before the ack, so
   a crash in between runs the job again rather than losing the count.
   Through Redis trouble it retries with backoff until it lands or a hard
   stop abandons the job (then False: no ack, the job's copy stays for the
   recovery, which runs it again).
3. ``failed``, before the failure is settled: records the jid and its
   error (class and message) in ``b-<bid>-failed``/``-failinfo``, which
   counts as "ran once" for ``complete``; a job that died (or was dropped
   by ``dead: false``) also fires ``death`` once. Retried through Redis
   trouble as a success is; the settle that follows retries the same way.
Nothing here raises into the processor: a batch in a bad state (garbage in
Redis) is logged as ``batch.unrecorded`` and the job is acknowledged.
"""

from __future__ import annotations

import contextvars
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push.batch import RUNNING
from wurk.push.batch_step import BatchError, run
from wurk.redis.policy import backoff_delay
from wurk.redis.pools import pool_for
from wurk.wire import batch
from wurk.wire.batch_lua import FAILED, SUCCEEDED
from wurk.wire.lua import Script
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.batch")
Token = contextvars.Token[str | None]
_rng = random.Random()  # jitter only


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


def succeeded(config: Config, job: dict[str, Any],
              abandoned: Callable[[float], bool]) -> bool:
    """Count a success; False when a hard stop abandoned the job before it could be."""
    bid = batch.bid_of(job) if batch.FIELD in job else None
    if bid is None:
        return True
    return _until_recorded(config, SUCCEEDED, [bid, str(job.get("jid"))], abandoned)


def failed(config: Config, job: dict[str, Any], exc: BaseException, outcome: str,
           abandoned: Callable[[float], bool]) -> None:
    """Record a failure; ``outcome`` is where the job goes: retry, dead or dropped."""
    bid = batch.bid_of(job) if batch.FIELD in job else None
    if bid is None:
        return
    died = "1" if outcome in ("dead", "dropped") else "0"
    try:
        info = dumps({"class": type(exc).__name__, "message": str(exc)[:1000],
                      "job": str(job.get("class"))[:200], "retry_count": job.get("retry_count")})
    except (TypeError, ValueError):  # a retry_count a middleware made unwritable
        info = dumps({"class": type(exc).__name__, "message": str(exc)[:1000]})
    # Abandoned by a hard stop: the settle that follows leaves the job to the recovery too.
    _until_recorded(config, FAILED, [bid, str(job.get("jid")), info, died], abandoned)


def _until_recorded(config: Config, script: Script, args: list[Any],
                    abandoned: Callable[[float], bool]) -> bool:
    """Run a batch script through Redis trouble, with backoff, until it lands (True),
    a hard stop abandons the job (False), or Redis refuses it for good (logged, True)."""
    bid, jid = args[0], args[1]
    attempt = 0
    while True:
        try:
            if run(pool_for(config), script, args) == -1:
                log.warning("batch.gone", bid=bid, jid=jid)
            return True
        except Exception as exc:  # noqa: BLE001 - Redis trouble: wait and go again
            if _hopeless(exc):
                log.error("batch.unrecorded", bid=bid, jid=jid, step=script.name,
                          error=describe(exc))
                return True
            attempt += 1
            wait = backoff_delay(attempt, config.redis_retry_base, config.redis_retry_cap, _rng)
            log.warning("batch.retrying", bid=bid, jid=jid, step=script.name, attempt=attempt,
                        error=describe(exc), wait=round(wait, 3))
            if abandoned(wait):
                return False


def _hopeless(exc: Exception) -> bool:
    """A refusal that the same call would meet again: bad state in Redis, not an outage."""
    if isinstance(exc, BatchError | ValueError | TypeError):
        return True
    text = str(exc)
    return isinstance(exc, rx.ResponseError) and (
        "WRONGTYPE" in text or "script" in text.lower())

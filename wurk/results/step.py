"""Job results, worker side: keep what a job returned or how it failed.

A step on the job's lifecycle (:class:`ResultsStep`), called in only by a
payload that carries ``result_ttl`` (:mod:`wurk.results.records`); any other
job never meets it.

Duties:
1. The run keeps what the job returned (``Run.value``); a middleware that
   skips the job leaves none, and the result is then a success with a null
   value.
2. A success: the success record (or, for a value JSON cannot carry or too
   big to keep, a final error record saying so), written with the job's
   settlement BEFORE its acknowledgement.
3. A failure: the error record, BEFORE the failure is settled: a final one
   when the job dies or is dropped, a non-final one (``final: false``, no
   waiter woken) when a retry follows.
4. Never fail a job and never end a thread because a result could not be
   stored: the store is one of the settlement's writes
   (``wurk.runtime.lifecycle.writes``), retried through Redis trouble that
   waiting cures (an outage, a dropped connection) until it lands or a hard
   stop abandons the job; any other refusal by Redis is retried a few
   times, then logged (``result.not_stored``) and the job goes on to its
   acknowledgement.

Why result first, then the acknowledgement: reliable fetch batches acks
with its next claim, so the two cannot share a script without changing
that round trip for every job. A crash between the two leaves the job in
its private list; the reaper requeues it, it runs again and stores its
result again (the same key, overwritten by the later run). A crash before
the store leaves no result and the job still unacknowledged: it runs again
and stores it then. Either way no result is lost silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import redis_trouble
from wurk.redis.wait import waiting_helps
from wurk.results import records as results
from wurk.results.records import TTL
from wurk.runtime.lifecycle.step import SKIPPED, Ending, Run, Step
from wurk.runtime.lifecycle.writes import Write
from wurk.runtime.retry import exception_message

if TYPE_CHECKING:
    pass

__all__ = ["TTL", "ResultsStep", "store_writes"]

log = get_logger("wurk.results")
# Tries for a refusal that waiting does not cure (maxmemory, a wrong key type).
OTHER_ATTEMPTS = 3
_FINAL_OUTCOMES = ("dead", "dropped", "cancelled")


class ResultsStep(Step):
    name = "results"
    triggers = (TTL,)

    def concluding(self, run: Run, ending: Ending) -> list[Write]:
        job = run.job
        if ending.failure is None:
            # A middleware that skipped the job: done, with nothing returned.
            value = None if run.value is SKIPPED else run.value
            record, final = results.success_record(job, value, time.time())
        else:
            final = ending.outcome in _FINAL_OUTCOMES
            record = results.error_record(job, type(ending.failure).__name__,
                                          exception_message(ending.failure), final, time.time())
        return store_writes(job, record, final, run.abandoned)


def store_writes(job: dict[str, Any], record: str, final: bool,
                 abandoned: Callable[[float], bool]) -> list[Write]:
    jid = job.get("jid")
    if not isinstance(jid, str) or not jid:
        log.warning("result.no_jid", job_class=str(job.get("class")))
        return []
    if abandoned(0):
        return []  # a hard stop gave the job back: its next run stores the result
    keys, args = results.store_args(jid, record, results.ttl_of(job), final)
    return [Write(results.STORE, keys, args, refused=_Refusals(jid))]


class _Refusals:
    """A store Redis refused: retried while waiting may cure it, a few times otherwise."""

    def __init__(self, jid: str) -> None:
        self.jid = jid
        self.others = 0

    def __call__(self, exc: Exception, attempt: int) -> bool:
        self.others += 0 if waiting_helps(exc) else 1
        if self.others >= OTHER_ATTEMPTS or not redis_trouble(exc):
            log.error("result.not_stored", jid=self.jid, error=describe(exc), attempts=attempt)
            return False
        log.warning("result.store_failed", jid=self.jid, attempt=attempt, error=describe(exc))
        return True

"""Job results, worker side: keep what a job returned or how it failed.

The processor calls in here only for a payload that carries ``result_ttl``
(:mod:`wurk.wire.results`); for any other job the cost is the one dict
lookup of that check, and no Redis command.

Duties:
1. :func:`capturing`: wrap a job's callable so its return value is kept
   (per thread) for :func:`succeeded`; a middleware that skips the job
   leaves none, and the result is then a success with a null value.
2. :func:`succeeded`: store the success record (or, for a value JSON cannot
   carry or too big to keep, a final error record saying so) BEFORE the
   processor hands the acknowledgement to the fetch.
3. :func:`failed`: store the error record BEFORE the failure is settled: a
   final one when the job dies or is dropped, a non-final one (``final:
   false``, no waiter woken) when a retry follows.
4. Never fail a job and never end a thread because a result could not be
   stored: through Redis trouble that waiting cures (an outage, a dropped
   connection) the store is retried with the usual backoff until it lands
   or a hard stop abandons the job, as a failure's settle is; any other
   refusal is retried a few times, then logged (``result.not_stored``) and
   the job goes on to its acknowledgement.

Why result first, then the acknowledgement: reliable fetch batches acks
with its next claim, so the two cannot share a script without changing
that round trip for every job. A crash between the two leaves the job in
its private list; the reaper requeues it, it runs again and stores its
result again (the same key, overwritten by the later run). A crash before
the store leaves no result and the job still unacknowledged: it runs again
and stores it then. Either way no result is lost silently.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.policy import backoff_delay
from wurk.redis.pools import pool_for
from wurk.redis.wait import waiting_helps
from wurk.runtime.retry import exception_message
from wurk.wire import results
from wurk.wire.results import TTL

if TYPE_CHECKING:
    from wurk.settings.config import Config

__all__ = ["TTL", "capturing", "failed", "succeeded"]

log = get_logger("wurk.results")
# Tries for a refusal that waiting does not cure (maxmemory, a wrong key type).
OTHER_ATTEMPTS = 3
_FINAL_OUTCOMES = ("dead", "dropped")
_SKIPPED = object()
_held = threading.local()
_rng = random.Random()
Abandoned = Callable[[float], bool]


def capturing(perform: Callable[..., Any]) -> Callable[..., Any]:
    """``perform``, keeping its return value for this thread's :func:`succeeded`."""
    _held.value = _SKIPPED

    def run(*args: Any) -> Any:
        value = perform(*args)
        _held.value = value
        return value

    return run


def succeeded(config: Config, job: dict[str, Any], abandoned: Abandoned) -> None:
    value = getattr(_held, "value", _SKIPPED)
    _held.value = _SKIPPED
    if value is _SKIPPED:
        value = None  # a middleware skipped the job: it counts as done, with nothing returned
    record, final = results.success_record(job, value, time.time())
    _store(config, job, record, final, abandoned)


def failed(config: Config, job: dict[str, Any], exc: BaseException, outcome: str,
           abandoned: Abandoned) -> None:
    """``outcome`` is the settlement's: "retry", "dead" or "dropped"."""
    _held.value = _SKIPPED
    final = outcome in _FINAL_OUTCOMES
    record = results.error_record(job, type(exc).__name__, exception_message(exc), final,
                                  time.time())
    _store(config, job, record, final, abandoned)


def _store(config: Config, job: dict[str, Any], record: str, final: bool,
           abandoned: Abandoned) -> None:
    jid = job.get("jid")
    if not isinstance(jid, str) or not jid:
        log.warning("result.no_jid", job_class=str(job.get("class")))
        return
    if abandoned(0):
        return  # a hard stop gave the job back: its next run stores the result
    ttl = results.ttl_of(job)
    attempt = others = 0
    while True:
        try:
            pool_for(config).run(lambda c: results.store(c, jid, record, ttl, final),
                                 idempotent=True)
            return
        except Exception as exc:  # noqa: BLE001 - the job's outcome stands; only the result waits
            attempt += 1
            others += 0 if waiting_helps(exc) else 1
            if others >= OTHER_ATTEMPTS:
                log.error("result.not_stored", jid=jid, error=describe(exc), attempts=attempt)
                return
            log.warning("result.store_failed", jid=jid, attempt=attempt, error=describe(exc))
        if abandoned(backoff_delay(attempt, config.redis_retry_base, config.redis_retry_cap,
                                   _rng)):
            log.warning("result.store_abandoned", jid=jid)
            return

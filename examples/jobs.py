"""Example jobs for ``wurk run -r examples.jobs -q critical:2 -q default``.

Each job writes what it did to Redis under an ``examples:`` key, through the
worker's own pool, so ``scripts/run-example`` (or you, with redis-cli) can see
the effect. They are written to be idempotent, as every wurk job should be:
delivery is at least once, so a job may run again after a crash or a hard
stop, and running it twice must do no harm.

1. ``send_welcome_email``: a function job on the ``default`` queue.
2. ``ChargeCard``: a class job on the ``critical`` queue.
3. ``BuildReport``: fails on its first attempt, retries after about a second
   (plus Sidekiq's jitter) and then succeeds.
4. ``send_reminder``: an ordinary job that the enqueuer schedules with
   ``perform_in(2, ...)``.
"""

from __future__ import annotations

import time
from typing import Any

import wurk
from wurk.core.logging import get_logger
from wurk.redis.runtime import runtime_for

log = get_logger("examples.jobs")

WELCOMED = "examples:welcomed"
CHARGES = "examples:charges"
REPORTS = "examples:reports"
REMINDED = "examples:reminded"


def _redis(*command: Any, idempotent: bool = True) -> Any:
    """Run one command on the worker's Redis (the URL ``wurk run`` was given)."""
    return runtime_for(wurk.default_config()).pool.call(*command, idempotent=idempotent)


@wurk.job(queue="default")
def send_welcome_email(user_id: int, address: str) -> None:
    """Pretend to send a welcome email: log it and remember who got one."""
    # SADD makes a second delivery harmless: a user is welcomed at most once.
    if _redis("SADD", WELCOMED, user_id) == 0:
        log.info("example.welcome_skipped", user_id=user_id, reason="already sent")
        return
    log.info("example.welcome_sent", user_id=user_id, to=address)


class ChargeCard(wurk.Job, queue="critical", retry=5):
    """Charge an order once. The order id is the idempotency key."""

    def perform(self, order_id: str, cents: int) -> None:
        # HSETNX: a replayed charge finds the order already settled.
        if _redis("HSETNX", CHARGES, order_id, cents) == 0:
            log.info("example.charge_skipped", order_id=order_id, jid=self.jid)
            return
        log.info("example.charged", order_id=order_id, cents=cents, jid=self.jid)


class ReportNotReadyError(RuntimeError):
    """The data a report needs is not there yet; trying again later fixes it."""


class BuildReport(wurk.Job, retry=3):
    """Fails on its first attempt, then succeeds when the retry runs."""

    def perform(self, name: str) -> None:
        # Sidekiq stamps retry_count on the payload after the first failure.
        if "retry_count" not in self.payload:
            raise ReportNotReadyError(f"report {name!r}: upstream data not ready yet")
        _redis("HSET", REPORTS, name, time.time())
        log.info("example.report_built", name=name, retries=self.payload["retry_count"] + 1)

    def retry_in(self, count: int, exc: BaseException) -> float:
        """Retry after one second rather than Sidekiq's default of 15 or more."""
        return 1.0


@wurk.job()
def send_reminder(user_id: int, text: str) -> None:
    """A job the enqueuer schedules two seconds ahead."""
    _redis("SADD", REMINDED, user_id)
    log.info("example.reminder_sent", user_id=user_id, text=text)

"""Failures: Sidekiq's retry bookkeeping, backoff, the retry set and the morgue.

Duties:
1. Decide, for a job that raised, whether it retries, dies or is dropped,
   reading ``retry``, ``retry_for``, ``retry_queue``, ``backtrace`` and
   ``dead`` from the payload first and the registered options second.
2. Stamp the failure fields (error_message, error_class, failed_at,
   retried_at, retry_count, error_backtrace) the way Sidekiq's API reads them.
3. Compute the delay with Sidekiq's formula (a pure function).
4. Write the retry entry, or kill into ``dead`` with its size and age caps,
   and run the death handlers.
"""

from __future__ import annotations

import base64
import json
import random
import time
import traceback
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from wurk import keys
from wurk.logging import get_logger
from wurk.payload import dumps, now_stamp, score, to_seconds

if TYPE_CHECKING:
    from wurk.config import Config
    from wurk.job import JobOptions

MAX_MESSAGE = 10_000
log = get_logger("wurk.retry")


def retry_delay(count: int, rng: random.Random, custom: float | None = None) -> float:
    """Seconds until retry number ``count`` (0 on the first failure) runs.

    Sidekiq 6.4-7.3: ``count**4 + 15 + rand(10) * (count + 1)``; a custom
    ``retry_in`` value replaces the first two terms, the jitter stays.
    """
    base = custom if custom is not None and custom > 0 else count**4 + 15
    return base + rng.randrange(10) * (count + 1)


def encode_backtrace(lines: list[str]) -> str:
    """base64(zlib(JSON array)), which every Sidekiq version's API decodes."""
    return base64.b64encode(zlib.compress(dumps(lines).encode())).decode()


def decode_backtrace(value: str) -> list[str]:
    decoded: list[str] = json.loads(zlib.decompress(base64.b64decode(value)))
    return decoded


def backtrace_lines(exc: BaseException) -> list[str]:
    """Innermost frame first, as Ruby prints them: ``file:line:in `func'``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename}:{f.lineno}:in `{f.name}'" for f in reversed(frames)]


def kill_commands(config: Config, raw: str | bytes, now: float) -> list[tuple[Any, ...]]:
    """Sidekiq's DeadSet#kill: add, then trim by age and by size."""
    return [
        ("ZADD", keys.DEAD, score(now), raw),
        ("ZREMRANGEBYSCORE", keys.DEAD, "-inf", score(now - config.dead_timeout)),
        ("ZREMRANGEBYRANK", keys.DEAD, 0, -config.dead_max_jobs),
    ]


def kill(config: Config, raw: str | bytes, now: float | None = None) -> None:
    """Send a payload (parsed or not) to the morgue. Replay-safe: one exact member."""
    commands = kill_commands(config, raw, time.time() if now is None else now)
    config.pool.pipeline(commands, transaction=True, idempotent=True)


class RetryHandler:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()

    def handle(self, job: dict[str, Any], queue: str, exc: BaseException,
               options: JobOptions | None) -> str:
        """Record a failure; returns "retry", "dead" or "dropped"."""
        retry = job.get("retry", options.retry if options else True)
        if retry is None or retry is False:
            self._died(job, exc)
            return "dropped"
        max_retries = retry if isinstance(retry, int) and not isinstance(retry, bool) \
            else self.config.max_retries
        now = time.time()
        self._stamp(job, queue, exc, now, options)
        if self._exhausted(job, max_retries, now):
            return self._exhaust(job, exc, options, now)
        custom = self._custom_delay(job, exc, options)
        if custom == "kill":
            return self._exhaust(job, exc, options, now)
        if custom == "discard":
            return "dropped"
        delay = retry_delay(job["retry_count"], self.rng,
                            custom if isinstance(custom, int | float) else None)
        self.config.pool.pipeline([("ZADD", keys.RETRY, score(now + delay), dumps(job))],
                                  idempotent=True)
        return "retry"

    def _stamp(self, job: dict[str, Any], queue: str, exc: BaseException, now: float,
               options: JobOptions | None) -> None:
        job["queue"] = job.get("retry_queue") or queue
        message = str(exc)[:MAX_MESSAGE]
        job["error_message"] = message.encode("utf-8", "replace").decode("utf-8")
        job["error_class"] = type(exc).__name__
        stamp = now_stamp(self.config.timestamps, now)
        if "retry_count" in job:
            job["retried_at"] = stamp
            job["retry_count"] = int(job["retry_count"]) + 1
        else:
            job["failed_at"] = stamp
            job["retry_count"] = 0
        backtrace = job.get("backtrace", options.backtrace if options else None)
        if backtrace:
            lines = backtrace_lines(exc)
            if not isinstance(backtrace, bool):
                lines = lines[: int(backtrace)]
            job["error_backtrace"] = encode_backtrace(lines)

    @staticmethod
    def _exhausted(job: Mapping[str, Any], max_retries: int, now: float) -> bool:
        retry_for = job.get("retry_for")
        if isinstance(retry_for, int | float) and not isinstance(retry_for, bool):
            failed_at = to_seconds(job.get("failed_at")) or now
            return failed_at + retry_for < now
        return int(job["retry_count"]) >= max_retries

    @staticmethod
    def _custom_delay(job: Mapping[str, Any], exc: BaseException,
                      options: JobOptions | None) -> float | str | None:
        if options is None or options.retry_in is None:
            return None
        try:
            return options.retry_in(int(job["retry_count"]), exc, job)
        except Exception as hook_error:  # noqa: BLE001 - a broken hook falls back to the default
            log.warning("retry.retry_in_failed", error=repr(hook_error), jid=job.get("jid"))
            return None

    def _exhaust(self, job: dict[str, Any], exc: BaseException, options: JobOptions | None,
                 now: float) -> str:
        if options is not None and options.retries_exhausted is not None:
            try:
                options.retries_exhausted(job, exc)
            except Exception as hook_error:  # noqa: BLE001
                log.warning("retry.exhausted_hook_failed", error=repr(hook_error),
                            jid=job.get("jid"))
        outcome = "dropped"
        if job.get("dead", options.dead if options else None) is not False:
            kill(self.config, dumps(job), now)
            outcome = "dead"
        self._died(job, exc)
        return outcome

    def _died(self, job: Mapping[str, Any], exc: BaseException) -> None:
        for handler in self.config.death_handlers:
            try:
                handler(job, exc)
            except Exception as hook_error:  # noqa: BLE001
                log.warning("retry.death_handler_failed", error=repr(hook_error),
                            jid=job.get("jid"))

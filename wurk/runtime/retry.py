"""Failures: Sidekiq's retry bookkeeping, backoff, the retry set and the morgue.

Duties:
1. Decide, for a job that raised, whether it retries, dies or is dropped,
   reading ``retry``, ``retry_for``, ``retry_queue``, ``backtrace`` and
   ``dead`` from the payload first and the registered options second.
2. Stamp the failure fields (error_message, error_class, failed_at,
   retried_at, retry_count, error_backtrace) the way Sidekiq's API reads them.
3. Compute the delay with Sidekiq's formula (a pure function).
4. Say where the job goes (:meth:`RetryHandler.plan` returns a
   :class:`wurk.runtime.settle.Settlement`: a retry entry, a dead entry with
   Sidekiq's size and age caps, or dropped) and run the death handlers; the
   processor writes it together with the removal of the job's claimed copy.
5. Past a job's ``deadline`` no retry is attempted: a failure whose next
   run would start after it goes to dead (or is dropped with
   ``dead: false``), as if its retries were exhausted.
6. A class this process does not know (:class:`wurk.UnknownJobError`) is
   a deployment's problem, not the job's: whatever its ``retry`` and
   ``dead`` say, it retries with the usual backoff for its own count
   (``retry`` when a positive int, else ``max_retries``) and only then goes
   to dead; each time is logged as ``job.unknown_class`` with the process.
7. Read whatever a payload carries without crashing: a ``retry_count`` that
   is null, false or missing is a first failure (as in Sidekiq); one that is
   not a count ("abc", true, 2.5) sends the job to ``dead`` with the reason
   in ``error_message``; a ``backtrace`` that is not true or a number is
   read as Ruby's ``to_i`` reads it; hooks that raise anything are logged.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re
import socket
import time
import traceback
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.core.validate import finite_float, is_number, is_whole
from wurk.push.job import UnknownJobError
from wurk.redis.runtime import handed
from wurk.runtime.settle import note, write
from wurk.runtime.time_limits import deadline_of, past_deadline
from wurk.runtime.work import Reason, Settlement
from wurk.wire import keys
from wurk.wire.payload import dumps, now_stamp, score, to_seconds

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.runtime import Runtime
    from wurk.settings.config import Config

MAX_MESSAGE = 10_000
# Beyond this a count's fourth power (the backoff) is no longer exact as a float.
MAX_RETRY_COUNT = 2**53
# Sidekiq's stand-in for an exception whose message cannot be read.
UNREADABLE_MESSAGE = "!!! ERROR MESSAGE THREW AN ERROR !!!"
_LEADING_INT = re.compile(r"\s*([+-]?\d{1,18})")
log = get_logger("wurk.retry")


def retry_delay(count: int, rng: random.Random, custom: float | None = None) -> float:
    """Seconds until retry number ``count`` (0 on the first failure) runs.

    Sidekiq 6.4-7.3: ``count**4 + 15 + rand(10) * (count + 1)``. A positive
    custom ``retry_in`` value is the delay itself: Sidekiq adds its jitter to
    it too, but a hook that returns 1 means one second, as documented.
    """
    if custom is not None and custom > 0:
        return custom
    return count**4 + 15 + rng.randrange(10) * (count + 1)


def encode_backtrace(lines: list[str]) -> str:
    """base64(zlib(JSON array)), which every Sidekiq version's API decodes."""
    return base64.b64encode(zlib.compress(dumps(lines).encode())).decode()


def decode_backtrace(value: str) -> list[str]:
    decoded: list[str] = json.loads(zlib.decompress(base64.b64decode(value)))
    return decoded


def exception_message(exc: BaseException) -> str:
    """The message, cut and made valid UTF-8; never raises (a ``__str__`` may)."""
    try:
        message = str(exc)[:MAX_MESSAGE]
    except BaseException:  # noqa: BLE001 - a broken __str__ must not stop the failure's record
        return UNREADABLE_MESSAGE
    return message.encode("utf-8", "replace").decode("utf-8")


class UnusableCountError(ValueError):
    """A ``retry_count`` that is not a count: a string, true, a fraction, a huge number."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"retry_count {value!r:.60} is not a count")


def next_retry_count(value: Any) -> int | None:
    """The ``retry_count`` after this failure, or None for a first failure.

    Sidekiq 6.4 (``JobRetry#attempt_retry``) asks ``if msg["retry_count"]``:
    null, false and a missing key are a first failure. Any other value that
    is not an integer (integral floats pass) raises :class:`UnusableCountError`.
    """
    if value is None or value is False:
        return None
    if not is_number(value):
        raise UnusableCountError(value)
    if isinstance(value, float) and not value.is_integer():
        raise UnusableCountError(value)
    if abs(value) >= MAX_RETRY_COUNT:
        raise UnusableCountError(value)
    return int(value) + 1


def backtrace_limit(value: Any) -> int | None:
    """How many lines a truthy ``backtrace`` keeps; None means all (``true``).

    Sidekiq 6.4 keeps ``backtrace[0...msg["backtrace"].to_i]``, so a number
    cuts (a negative one from the end) and a string keeps its leading
    integer's worth: "abc" keeps none. Anything else keeps none too.
    """
    if value is True:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0
    match = _LEADING_INT.match(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else 0


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


def kill(runtime: Runtime, raw: str | bytes, now: float | None = None,
         reason: Reason | None = None) -> None:
    """Send a payload (parsed or not) to the morgue. Replay-safe: one exact member.

    ``reason``: why raw bytes go there as they are, noted beside them first.
    """
    now = time.time() if now is None else now
    if reason is not None:
        note(runtime, raw, reason, now)
    commands = kill_commands(runtime.config, raw, now)
    runtime.pool.pipeline(commands, transaction=True, idempotent=True)


def unknown_class_budget(retry: Any, default: int) -> int:
    """How many retries a job of a class this process lacks gets: its own
    ``retry`` when a positive int, else ``default``; never none at all."""
    if is_whole(retry) and retry > 0:
        return retry
    return max(default, 1)


class RetryHandler:
    def __init__(self, config: Config, rng: random.Random | None = None, *,
                 runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.rng = rng or random.Random()
        # The process, named in the unknown-class line (the launcher sets it).
        self.identity: str | None = None

    def handle(self, job: dict[str, Any], queue: str, exc: BaseException,
               options: JobOptions | None) -> str:
        """Plan and write at once (no claimed copy to remove); returns the outcome."""
        settlement = self.plan(job, queue, exc, options)
        write(self.runtime, settlement)
        return settlement.outcome

    def plan(self, job: dict[str, Any], queue: str, exc: BaseException,
             options: JobOptions | None) -> Settlement:
        """Stamp the failure on ``job`` and say where it goes; runs the hooks, writes nothing.

        Raises only if the stamped job cannot be serialised (a middleware put
        something in it that JSON cannot carry, or it is nested too deep).
        """
        if isinstance(exc, UnknownJobError):
            return self._unknown_class(job, queue, exc)
        return self._known_class(job, queue, exc, options)

    def _known_class(self, job: dict[str, Any], queue: str, exc: BaseException,
                     options: JobOptions | None) -> Settlement:
        retry = job.get("retry")
        if retry is None:
            # Sidekiq fills a null (or missing) retry from the job class's own option.
            retry = options.retry if options else True
        if retry is False:
            self._died(job, exc)
            return Settlement("dropped")
        now = time.time()
        try:
            self._stamp(job, queue, exc, now, options)
        except UnusableCountError as bad:
            return self._unusable(job, exc, bad, now)
        if self._exhausted(job, retry, now):
            return self._exhaust(job, exc, options, now)
        custom = self._custom_delay(job, exc, options)
        if custom == "kill":
            return self._exhaust(job, exc, options, now)
        if custom == "discard":
            return Settlement("dropped")
        return self._retry(job, exc, options, now,
                           retry_delay(job["retry_count"], self.rng, finite_float(custom)))

    def _unknown_class(self, job: dict[str, Any], queue: str, exc: BaseException) -> Settlement:
        """Retry within the budget, then dead; never dropped: ``retry``, ``dead``,
        ``retry_for`` and ``deadline`` are the job's to apply where its class is known."""
        now = time.time()
        try:
            self._stamp(job, queue, exc, now, None)
        except UnusableCountError as bad:
            return self._unusable(job, exc, bad, now)
        count, budget = int(job["retry_count"]), unknown_class_budget(
            job.get("retry"), self.config.max_retries)
        where = {"identity": self.identity, "hostname": socket.gethostname(), "pid": os.getpid()}
        job["error_message"] += f" (in process {self.identity or where['pid']})"
        log.warning("job.unknown_class", jid=job.get("jid"), job_class=job.get("class"),
                    retry_count=count, budget=budget, **where)
        if count >= budget:
            self._died(job, exc)
            return Settlement.dead(dumps(job), now)
        return Settlement("retry", dumps(job), now + retry_delay(count, self.rng))

    def _retry(self, job: dict[str, Any], exc: BaseException, options: JobOptions | None,
               now: float, delay: float) -> Settlement:
        """A retry entry, unless the retry would run after the job's deadline."""
        if past_deadline(deadline_of(job, options), now + delay):
            log.info("retry.past_deadline", jid=job.get("jid"), deadline=job.get("deadline"))
            return self._exhaust(job, exc, options, now)
        return Settlement("retry", dumps(job), now + delay)

    def _stamp(self, job: dict[str, Any], queue: str, exc: BaseException, now: float,
               options: JobOptions | None) -> None:
        retry_queue = job.get("retry_queue")
        job["queue"] = retry_queue if isinstance(retry_queue, str) and retry_queue else queue
        job["error_message"] = exception_message(exc)
        job["error_class"] = type(exc).__name__
        stamp = now_stamp(self.config.timestamps, now)
        count = next_retry_count(job.get("retry_count"))
        if count is None:
            job["failed_at"] = stamp
            job["retry_count"] = 0
        else:
            job["retried_at"] = stamp
            job["retry_count"] = count
        backtrace = job.get("backtrace", options.backtrace if options else None)
        if backtrace:
            lines = backtrace_lines(exc)
            limit = backtrace_limit(backtrace)
            job["error_backtrace"] = encode_backtrace(lines if limit is None else lines[:limit])

    def _unusable(self, job: dict[str, Any], exc: BaseException, bad: UnusableCountError,
                  now: float) -> Settlement:
        """Dead, whatever ``dead`` says: a person must see it, and retrying cannot count."""
        log.error("retry.unusable_count", jid=job.get("jid"), reason=str(bad), error=describe(exc))
        job["error_message"] = f"{job['error_message']} (wurk: {bad}, so the job went to dead)"
        # A count a retry from the morgue can decrement, in wurk's API and in Sidekiq's.
        job["retry_count"] = 0
        job.setdefault("failed_at", now_stamp(self.config.timestamps, now))
        self._died(job, exc)
        return Settlement.dead(dumps(job), now)

    def _exhausted(self, job: Mapping[str, Any], retry: Any, now: float) -> bool:
        retry_for = finite_float(job.get("retry_for"))
        if retry_for is not None:
            failed_at = to_seconds(job.get("failed_at")) or now
            return failed_at + retry_for < now
        max_retries = retry if is_whole(retry) else self.config.max_retries
        return int(job["retry_count"]) >= max_retries

    @staticmethod
    def _custom_delay(job: Mapping[str, Any], exc: BaseException,
                      options: JobOptions | None) -> Any:
        if options is None or options.retry_in is None:
            return None
        try:
            return options.retry_in(int(job["retry_count"]), exc, job)
        except BaseException as hook_error:  # noqa: BLE001 - a broken hook falls back to the default
            log.warning("retry.retry_in_failed", error=describe(hook_error), jid=job.get("jid"))
            return None

    def _exhaust(self, job: dict[str, Any], exc: BaseException, options: JobOptions | None,
                 now: float) -> Settlement:
        if options is not None and options.retries_exhausted is not None:
            try:
                options.retries_exhausted(job, exc)
            except BaseException as hook_error:  # noqa: BLE001
                log.warning("retry.exhausted_hook_failed", error=describe(hook_error),
                            jid=job.get("jid"))
        settlement = Settlement("dropped")
        if job.get("dead", options.dead if options else None) is not False:
            settlement = Settlement.dead(dumps(job), now)
        self._died(job, exc)
        return settlement

    def _died(self, job: Mapping[str, Any], exc: BaseException) -> None:
        for handler in self.config.death_handlers:
            try:
                handler(job, exc)
            except BaseException as hook_error:  # noqa: BLE001
                log.warning("retry.death_handler_failed", error=describe(hook_error),
                            jid=job.get("jid"))

"""Job results on the wire: the payload field, the two keys, the record, the script.

A job pushed with ``store_result`` carries ``result_ttl`` (seconds) in its
payload, a field only wurk reads (Sidekiq ignores it and keeps it through
retries and the morgue). When the job ends, the worker writes:

* ``wurk:result:<jid>``: a STRING holding the record, a JSON object (see
  :class:`Outcome` and docs/reference/redis-format.md), with the TTL;
* ``wurk:result-ready:<jid>``: a LIST holding one token, with the same TTL,
  present only while the record is final. Waiters block on it with
  ``BRPOPLPUSH key key``, which rotates the list onto itself: the token is
  never taken away, so every waiter wakes, and one that comes later finds it.

Duties:
1. Name the keys and the payload field; the default and largest TTL.
2. Read a payload's ``result_ttl`` without trusting it (:func:`ttl_of`).
3. Build the record (:func:`success_record`, :func:`error_record`) and read
   one back from Redis without trusting it (:func:`parse`).
4. :data:`STORE`: write a record and its token in one script.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from wurk.core.validate import is_number, is_whole
from wurk.wire.lua import Script
from wurk.wire.payload import ArgumentError, check_args, dumps

# The payload field: present (seconds) means "store this job's result".
TTL = "result_ttl"
DEFAULT_TTL = 24 * 3600
MAX_TTL = 365 * 24 * 3600
# The largest record stored; a bigger return value is stored as an error.
MAX_RECORD_BYTES = 4 * 1024 * 1024
SUCCESS, FAILED = "success", "failed"
# The error class of a result that could not be stored as returned.
UNSERIALIZABLE = "wurk.UnserializableResult"


def key(jid: str) -> str:
    return f"wurk:result:{jid}"


def ready_key(jid: str) -> str:
    return f"wurk:result-ready:{jid}"


def ttl_of(payload: dict[str, Any]) -> int:
    """The payload's ``result_ttl`` as whole seconds in [1, MAX_TTL].

    The job asked for a result, so a value that is not a usable number
    (a string, true, NaN) still gets one, kept for the default TTL.
    """
    value = payload.get(TTL)
    if not is_number(value):
        return DEFAULT_TTL
    if isinstance(value, float) and not math.isfinite(value):
        return DEFAULT_TTL
    return int(min(max(value, 1), MAX_TTL))


@dataclass(frozen=True)
class Outcome:
    """A stored result, as :func:`parse` reads it back."""

    jid: str
    status: str  # SUCCESS or FAILED
    value: Any = None
    error_class: str = ""
    error_message: str = ""
    # False for an error a retry will follow; True once nothing will change it.
    final: bool = True
    job_class: str = ""
    retry_count: int | None = None
    finished_at: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCESS


def success_record(job: dict[str, Any], value: Any, now: float) -> tuple[str, bool]:
    """The record of a job that returned ``value``: (JSON text, final).

    A value JSON cannot carry unchanged (what job arguments may not be
    either: a set, a tuple, a dict with a non-string key, NaN), or one too
    big to store, becomes a final error record that says so; this never raises.
    """
    try:
        check_args(value, "the return value")
        text = dumps({"jid": job.get("jid"), "class": job.get("class"), "status": SUCCESS,
                      "value": value, "finished_at": now})
    except ArgumentError as exc:
        return error_record(job, UNSERIALIZABLE, f"a result must be JSON: {exc}", True,
                            now), True
    except (TypeError, ValueError, RecursionError) as exc:
        return error_record(job, UNSERIALIZABLE,
                            f"the job returned a value JSON cannot carry: "
                            f"{type(exc).__name__}: {exc}", True, now), True
    if len(text) > MAX_RECORD_BYTES:
        return error_record(job, UNSERIALIZABLE,
                            f"the job returned {len(text)} bytes of JSON, more than the "
                            f"{MAX_RECORD_BYTES} a result may hold", True, now), True
    return text, True


def error_record(job: dict[str, Any], error_class: str, message: str, final: bool,
                 now: float) -> str:
    count = job.get("retry_count")
    return dumps({"jid": job.get("jid"), "class": job.get("class"), "status": FAILED,
                  "error": {"class": error_class, "message": message[:10_000], "final": final},
                  "retry_count": count if isinstance(count, int) else None,
                  "finished_at": now})


class CorruptResultError(ValueError):
    """A result key holds something that is not a record wurk wrote."""


def parse(jid: str, raw: bytes | str) -> Outcome:
    """Read a record back; :class:`CorruptResultError` for anything else."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CorruptResultError(f"the result of {jid} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("status") not in (SUCCESS, FAILED):
        raise CorruptResultError(f"the result of {jid} is not a result record: {str(raw)[:100]}")
    finished = data.get("finished_at")
    finished_at = float(finished) if isinstance(finished, int | float) else 0.0
    job_class = data.get("class") if isinstance(data.get("class"), str) else ""
    count = data.get("retry_count")
    retry_count = count if is_whole(count) else None
    if data["status"] == SUCCESS:
        return Outcome(jid, SUCCESS, data.get("value"), job_class=str(job_class),
                       retry_count=retry_count, finished_at=finished_at)
    error = data.get("error")
    if not isinstance(error, dict):
        error = {}
    return Outcome(jid, FAILED, None, str(error.get("class", "")), str(error.get("message", "")),
                   error.get("final") is not False, str(job_class), retry_count, finished_at)


# Write a record; a final one also gets its waiters' token. The DEL comes
# first: a write that frees, so the script still runs at maxmemory (see
# wurk.wire.lua), and a non-final record leaves no token that would wake
# waiters for nothing. Replaying it writes the same thing again.
# KEYS: record, token list. ARGV: record JSON, TTL seconds, "1" when final.
STORE = Script(
    "result_store",
    """
redis.call("del", KEYS[2])
redis.call("set", KEYS[1], ARGV[1], "EX", ARGV[2])
if ARGV[3] == "1" then
  redis.call("rpush", KEYS[2], "1")
  redis.call("expire", KEYS[2], ARGV[2])
end
return 1
""",
)


def store_args(jid: str, record: str, ttl: int, final: bool) -> tuple[list[str], list[Any]]:
    """STORE's keys and arguments for one record."""
    return [key(jid), ready_key(jid)], [record, ttl, "1" if final else "0"]


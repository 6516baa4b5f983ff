"""Unique jobs on the wire: the lock key, its digest input, the payload fields.

A unique job holds a lock while it waits and (by default) while it runs: a
Redis string ``unique:<sha256 hex>`` whose value is the holder's jid, with a
TTL of ``unique_for`` seconds (plus the wait of a scheduled job). This is
Sidekiq Enterprise's layout, so a Ruby Enterprise process and wurk honour one
lock on a shared Redis (docs/reference/redis-format.md says exactly when).

Duties:
1. Write the digest input as canonical JSON: ``[class, queue, args]``
   compact, object keys sorted, floats as Ruby prints them (which is also
   the form wurk writes payloads in), integers as integers (``1`` and
   ``1.0`` stay different keys, as they reach a job as different types).
2. Name the lock key of a payload: the ``unique_lock`` field a wurk client
   wrote, when it is well formed, else the digest of the payload itself (a
   job Sidekiq pushed).
3. Read ``unique_until`` from untrusted payloads: anything unknown is the
   default, ``success``, as Sidekiq Enterprise reads it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from wurk.core.validate import is_number
from wurk.wire import keywords
from wurk.wire.payload import with_ruby_floats

PREFIX = "unique:"
# Payload fields: Sidekiq Enterprise's two, and wurk's record of the key it locked.
FOR, UNTIL, LOCK = "unique_for", "unique_until", "unique_lock"
SUCCESS, START, EXPIRY = "success", "start", "expiry"
UNTIL_VALUES = (SUCCESS, START, EXPIRY)
# The longest unique_for an option takes (about 31 years), and the longest TTL
# a push sets (a far-off scheduled time added): Redis refuses PX values that
# overflow its clock, and no lock should outlive the application anyway.
MAX_SECONDS = 1e9
MAX_TTL_MS = 10**15
_LOCK_KEY = re.compile(r"unique:[0-9a-f]{64}")


def canonical(value: Any) -> str:
    """Compact JSON with sorted object keys and Ruby's float forms."""
    return with_ruby_floats(json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                                       allow_nan=False, sort_keys=True))


def lock_key(job_class: str, queue: str, args: Any) -> str:
    """``unique:`` + SHA-256 of canonical ``[class, queue, args]``."""
    digest = hashlib.sha256(canonical([job_class, queue, args]).encode()).hexdigest()
    return PREFIX + digest


def lock_of(job: Mapping[str, Any]) -> str | None:
    """The lock key a job holds, or None when its payload cannot name one."""
    recorded = job.get(LOCK)
    if isinstance(recorded, str) and _LOCK_KEY.fullmatch(recorded):
        return recorded
    cls, queue = job.get("class"), job.get("queue")
    if not isinstance(cls, str) or not isinstance(queue, str):
        return None
    try:
        return lock_key(cls, queue, keywords.call_args(job))
    except (TypeError, ValueError, RecursionError):
        return None


def until_of(job: Mapping[str, Any]) -> str:
    until = job.get(UNTIL)
    return until if until in UNTIL_VALUES else SUCCESS


def is_unique(job: Mapping[str, Any]) -> bool:
    """Whether a payload asks for a lock: a positive ``unique_for`` (Sidekiq
    Enterprise reads ``false``, ``null`` and nothing as no lock)."""
    ttl = job.get(FOR)
    return is_number(ttl) and 0 < ttl < float("inf")

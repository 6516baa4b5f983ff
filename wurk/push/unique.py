"""Unique jobs, client side: the lock a push takes, and the option checks.

A job declared or pushed with ``unique_for=SECONDS`` is pushed only if no
other job with the same class, queue and arguments (or the same result of
the job's ``unique_key`` function) holds the lock; a duplicate push returns
None. The lock is taken by a built-in client middleware that runs last, after
the application's own (which may change the arguments), just before the
write: one extra round trip for a unique job, nothing for any other. The
worker releases it (:mod:`wurk.runtime.unique`); the format is in
:mod:`wurk.wire.unique`.

Duties:
1. Check the options when they are declared or set: ``unique_for`` a
   positive number of seconds up to MAX_SECONDS (None or False: no lock),
   ``unique_until`` one of success, start, expiry, ``unique_key`` a callable.
2. Remember each registered job's ``unique_key`` function by wire name (the
   middleware sees only the payload), as signatures are remembered.
3. ``lock``: the middleware. It names the key, records it in the payload
   (``unique_lock``), and takes the lock for ``unique_for`` seconds counted
   from the time the job is due to run, or stops the push when another jid
   holds it. A key function that raises or returns a non-string fails the
   push with nothing written.
4. ``unlock``: the compare-and-delete release, for the worker and for a push
   that took its lock but was not written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from wurk.core.logging import get_logger
from wurk.wire import unique
from wurk.wire.lua import UNIQUE_LOCK, UNIQUE_RELEASE

log = get_logger("wurk.unique")
KeyFunction = Callable[[list[Any]], str]
_key_functions: dict[str, KeyFunction] = {}


class UniqueKeyError(ValueError):
    """A job's ``unique_key`` function raised or did not return a string."""


def check_options(changes: dict[str, Any]) -> None:
    """Check (and normalise in place) the unique options among ``changes``."""
    if "unique_for" in changes:
        changes["unique_for"] = _seconds(changes["unique_for"])
    until = changes.get("unique_until")
    if until is not None and until not in unique.UNTIL_VALUES:
        raise TypeError(f"unique_until must be one of {', '.join(unique.UNTIL_VALUES)}, "
                        f"got {until!r}")
    key = changes.get("unique_key")
    if key is not None and not callable(key):
        raise TypeError(f"unique_key must be a callable (args) -> str, got {key!r}")


def _seconds(value: Any) -> int | float | None:
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not (0 < value < math.inf):
        raise TypeError(f"unique_for must be a positive finite number of seconds "
                        f"(or None for no lock), got {value!r}")
    if value > unique.MAX_SECONDS:
        raise TypeError(f"unique_for must be at most {unique.MAX_SECONDS:.0e} seconds, "
                        f"got {value!r}")
    return value


def remember(name: str, key: KeyFunction | None) -> None:
    if key is None:
        _key_functions.pop(name, None)
    else:
        _key_functions[name] = key


def forget(name: str) -> None:
    _key_functions.pop(name, None)


def key_for(payload: Mapping[str, Any]) -> str:
    """The lock key of a payload about to be pushed."""
    cls, queue, args = str(payload["class"]), str(payload["queue"]), payload["args"]
    function = _key_functions.get(cls)
    if function is None:
        return unique.lock_key(cls, queue, args)
    try:
        made = function(list(args))
    except Exception as exc:
        raise UniqueKeyError(f"unique_key of job {cls!r} raised {type(exc).__name__}: {exc}; "
                             "nothing was pushed") from exc
    if not isinstance(made, str):
        raise UniqueKeyError(f"unique_key of job {cls!r} must return a str, got "
                             f"{type(made).__name__}; nothing was pushed")
    return unique.lock_key(cls, queue, made)


def ttl_ms(payload: Mapping[str, Any], now: float) -> int:
    """``unique_for``, counted from when the job is due (Sidekiq Enterprise adds
    a scheduled job's wait), in whole milliseconds: at least one, at most
    MAX_TTL_MS (a raw payload's huge ``unique_for`` or far-off ``at``)."""
    seconds = float(payload[unique.FOR])
    at = payload.get("at")
    if isinstance(at, int | float) and not isinstance(at, bool) and at > now:
        seconds += at - now
    return min(unique.MAX_TTL_MS, max(1, math.ceil(seconds * 1000)))


def lock(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
         call_next: Callable[[], Any]) -> None:
    """The client middleware: go on only when this push holds the lock."""
    ttl = payload.get(unique.FOR)
    if ttl is None or ttl is False:
        call_next()  # Sidekiq Enterprise's way to push one job without a lock
        return
    if not unique.is_unique(payload):
        raise TypeError(f"unique_for must be a positive finite number of seconds, got "
                        f"{ttl!r}; nothing was pushed")
    key = key_for(payload)
    payload[unique.LOCK] = key
    jid = str(payload["jid"])
    ttl = ttl_ms(payload, time.time())
    # Safe to send twice: a replay after a lost reply finds our own jid and is granted.
    granted = redis.run(lambda c: UNIQUE_LOCK.run(c, [key], [jid, ttl]), idempotent=True)
    if granted == 1:
        call_next()
        return
    holder = granted.decode("utf-8", "replace") if isinstance(granted, bytes) else str(granted)
    log.info("unique.duplicate", job_class=job_class, jid=jid, queue=queue, lock=key,
             holder=holder[:64])


def unlock(payload: Mapping[str, Any], redis: Any) -> bool:
    """Drop the payload's recorded lock if it still holds the payload's jid."""
    key, jid = payload.get(unique.LOCK), payload.get("jid")
    if not isinstance(key, str) or not isinstance(jid, str):
        return False
    done = redis.run(lambda c: UNIQUE_RELEASE.run(c, [key], [jid]), idempotent=True)
    return bool(done == 1)

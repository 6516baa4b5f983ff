"""Unique jobs, client side: the lock a push takes, and the option checks.

A job declared or pushed with ``unique_for=SECONDS`` is pushed only if no
other job with the same class, queue and arguments (or the same result of
the job's ``unique_key`` function) holds the lock; a duplicate push returns
None. The lock is taken by a built-in step of the push pipeline
(:mod:`wurk.push.steps`) that runs after the application's own chain
(which may change the arguments), just before the write: one extra round
trip for a push or a bulk batch with unique jobs, nothing for any other.
The worker releases it (:mod:`wurk.unique.step`); the format is in
:mod:`wurk.unique.keys`.

Duties:
1. Check the options when they are declared or set: ``unique_for`` a
   positive number of seconds up to MAX_SECONDS (None or False: no lock),
   ``unique_until`` one of success, start, expiry, ``unique_key`` a callable.
2. Remember each registered job's ``unique_key`` function by wire name (the
   middleware sees only the payload), as signatures are remembered.
3. :class:`UniqueLock`, the built-in step. For each job of a push (or of a bulk
   batch, all in one round trip) it names the key, records it in the payload
   (``unique_lock``) and takes the lock for ``unique_for`` seconds counted
   from the time the job is due to run; a job whose key another jid holds
   is a duplicate and is not written. A key function that raises or returns
   a non-string fails the push with nothing written. The step only asks
   (:class:`~wurk.push.exchange.Ask`): each client sends it on its own pool.
4. ``release``: the compare-and-delete release, for jobs that took their
   lock but were not written; ``give_back`` sends it on the sync pool, for
   the worker and the admin API.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.validate import is_number
from wurk.push.exchange import Ask, Commands, Trip, raise_first, run
from wurk.unique import keys as unique
from wurk.wire import keywords
from wurk.wire.lua import UNIQUE_LOCK, UNIQUE_RELEASE

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool

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
    if not is_number(value) or not (0 < value < math.inf):
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
    # f(3) locks one key, pushed alone or as [3, {}] in a bulk push with keywords.
    cls, queue, args = (str(payload["class"]), str(payload["queue"]),
                        keywords.call_args(payload))
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


def ttl_ms(seconds: float, run_at: float | None, now: float) -> int:
    """``unique_for``, counted from when the job is due (Sidekiq Enterprise adds
    a scheduled job's wait), in whole milliseconds: at least one, at most
    MAX_TTL_MS (a raw payload's huge ``unique_for`` or far-off ``at``)."""
    if run_at is not None and run_at > now:
        seconds += run_at - now
    return min(unique.MAX_TTL_MS, max(1, math.ceil(seconds * 1000)))


def _wants_lock(payload: Mapping[str, Any]) -> bool:
    ttl = payload.get(unique.FOR)
    if ttl is None or ttl is False:
        return False  # Sidekiq Enterprise's way to push one job without a lock
    if not unique.is_unique(payload):
        raise TypeError(f"unique_for must be a positive finite number of seconds, got "
                        f"{ttl!r}; nothing was pushed")
    return True


class UniqueLock:
    """The built-in step: takes the lock of every job that carries ``unique_for``."""

    field = unique.FOR

    def admit(self, batch: Sequence[tuple[dict[str, Any], float | None]]) -> Ask | None:
        """The lock of every job of ``batch`` (payloads that carry ``unique_for``,
        with their run times) in one round trip; the answer is True for each job
        that goes ahead, False for a duplicate."""
        wanted, lock_keys, args = _lock_request(batch)
        if not lock_keys:
            return None
        # Safe to send twice: a replay after a lost reply finds each job's own jid.
        trip = Commands((("EVALSHA", UNIQUE_LOCK.sha, len(lock_keys), *lock_keys, *args),),
                        scripts=(UNIQUE_LOCK,))
        return Ask(trip, lambda replies: _verdicts(batch, wanted, raise_first(replies)[0]))

    def give_back(self, payloads: Iterable[Mapping[str, Any]]) -> Trip | None:
        return release(payloads)


def _lock_request(batch: Sequence[tuple[dict[str, Any], float | None]]
                  ) -> tuple[list[bool], list[str], list[Any]]:
    """Which jobs want a lock, and the script's keys and arguments for them;
    names each job's key in its payload (``unique_lock``)."""
    wanted = [_wants_lock(payload) for payload, _ in batch]
    now = time.time()
    lock_keys: list[str] = []
    args: list[Any] = []
    for (payload, run_at), wants in zip(batch, wanted, strict=True):
        if wants:
            payload[unique.LOCK] = key_for(payload)
            lock_keys.append(payload[unique.LOCK])
            args += [str(payload["jid"]), ttl_ms(float(payload[unique.FOR]), run_at, now)]
    return wanted, lock_keys, args


def _verdicts(batch: Sequence[tuple[dict[str, Any], float | None]], wanted: list[bool],
              replies: Iterable[Any]) -> list[bool]:
    replies = iter(replies)
    admitted = []
    for (payload, _), wants in zip(batch, wanted, strict=True):
        reply = next(replies) if wants else 1
        admitted.append(reply == 1)
        if reply != 1:
            _duplicate(payload, reply)
    return admitted


def _duplicate(payload: Mapping[str, Any], holder: Any) -> None:
    shown = holder.decode("utf-8", "replace") if isinstance(holder, bytes) else str(holder)
    log.info("unique.duplicate", job_class=payload.get("class"), jid=payload.get("jid"),
             queue=payload.get("queue"), lock=payload.get(unique.LOCK), holder=shown[:64])


def release(payloads: Iterable[Mapping[str, Any]]) -> Commands | None:
    """The trip that drops each payload's recorded lock if it still holds the
    payload's jid (None: no payload recorded one); its result is how many went."""
    lock_keys, jids = _held(payloads)
    if not lock_keys:
        return None
    return Commands((("EVALSHA", UNIQUE_RELEASE.sha, len(lock_keys), *lock_keys, *jids),),
                    scripts=(UNIQUE_RELEASE,))


def give_back(payloads: Iterable[Mapping[str, Any]], redis: RedisPool) -> int:
    """:func:`release` on the sync pool, in one round trip; how many locks went."""
    trip = release(payloads)
    return 0 if trip is None else int(raise_first(run(redis, trip))[0])


def _held(payloads: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    lock_keys, jids = [], []
    for payload in payloads:
        key, jid = payload.get(unique.LOCK), payload.get("jid")
        if isinstance(key, str) and isinstance(jid, str):
            lock_keys.append(key)
            jids.append(jid)
    return lock_keys, jids

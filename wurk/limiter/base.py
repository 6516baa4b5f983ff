"""What every limiter shares: the waiting ``acquire``, permits, errors, registration.

Duties:
1. :class:`Limiter`: ``acquire()`` as a context manager that checks once
   (one Lua script, one round trip) and, while refused, waits with
   :func:`~wurk.limiter.policy.poll_pause` up to ``wait_timeout`` before it
   raises :class:`OverLimit`; ``try_acquire()`` checks once and never waits.
2. Registration: the first check of a limiter object, and one an hour
   after, also writes its ``lmtr:<name>`` hash and its name in ``lmtr-list``
   inside the same script, so ``wurk limiters`` lists it at no extra cost.
3. :class:`Permit`: what an admitted check returns; ``release()`` frees a
   concurrent slot (and is a no-op for the other kinds).
4. Errors: :class:`OverLimit` (a limit was reached), and
   :class:`LimiterStateError` for state in Redis that no limiter wrote (a
   wrong-type key, a counter that is not a number), with the key to delete.
5. The config is looked up at use, not at construction, so a module-level
   limiter follows a later ``wurk.configure``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.limiter.policy import (
    DEFAULT_RESCHEDULE,
    check_name,
    check_reschedule,
    check_seconds,
    overrated_count,
    poll_pause,
)
from wurk.redis.pools import pool_for
from wurk.settings.config import default_config
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.settings.config import Config
    from wurk.wire.lua import Script

# Re-register (refresh the meta hash's TTL) this often per limiter object.
REGISTER_EVERY = 3600.0
Backoff = Callable[[int], float]


class OverLimit(Exception):  # noqa: N818 - Sidekiq Enterprise's name, which users search for
    """A limiter refused for ``wait_timeout`` seconds. Raised from inside a job,
    wurk reschedules the job without spending a retry (see docs/how-to/limiters.md)."""

    def __init__(self, limiter: Limiter) -> None:
        super().__init__(f"limit {limiter.name!r} ({limiter.kind}) reached")
        self.limiter = limiter


def reschedulable(exc: BaseException, job: dict[str, Any]) -> bool:
    """Whether a job that raised ``exc`` is rescheduled rather than failed: an
    :class:`OverLimit` whose limiter's ``reschedule`` cap is not yet spent."""
    return isinstance(exc, OverLimit) and \
        overrated_count(job.get("overrated")) < exc.limiter.reschedule


class LimiterStateError(RuntimeError):
    """A limiter's key in Redis holds something no limiter wrote."""


@dataclass
class Permit:
    """An admitted check: ``at`` is Redis's time of admission, ``used`` the count then."""

    limiter: Limiter
    at: float
    used: float
    member: str = ""
    released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """Free the slot now (concurrent limiters); safe to call twice."""
        if not self.released:
            self.released = True
            self.limiter.release(self)

    def renew(self) -> bool:
        """Extend a concurrent holder's lease; False if the lease had already run out."""
        return self.limiter.renew(self)


@dataclass(frozen=True)
class Refusal:
    used: float
    wait: float | None  # seconds until room may appear; None: only a release makes room


class Limiter:
    """The shared part of the four kinds; build them with ``wurk.limiter.<kind>(...)``."""

    kind = ""
    script: Script

    def __init__(self, name: str, limit: Any, *, wait_timeout: Any = 5.0,
                 reschedule: Any = DEFAULT_RESCHEDULE, backoff: Backoff | None = None,
                 config: Config | None = None) -> None:
        self.name = check_name(name)
        self.limit = self._check_limit(limit)
        self.wait_timeout = check_seconds(wait_timeout, "wait_timeout", zero=True,
                                          most=3600.0)
        self.reschedule = check_reschedule(reschedule)
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a function of the reschedule count, "
                            f"not {backoff!r:.60}")
        self.backoff = backoff
        self._config = config
        self._registered_at: float | None = None
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} limit={self.limit:g}>"

    @staticmethod
    def _check_limit(limit: Any) -> float:
        raise NotImplementedError

    @property
    def config(self) -> Config:
        return self._config or default_config()

    # -- what a caller uses ----------------------------------------------------------
    @contextlib.contextmanager
    def acquire(self, wait_timeout: float | None = None) -> Iterator[Permit]:
        """Wait up to ``wait_timeout`` (default: the limiter's) for room, run the
        block, then release; raises :class:`OverLimit` when no room came."""
        permit = self.wait(wait_timeout)
        try:
            yield permit
        finally:
            permit.release()

    def wait(self, wait_timeout: float | None = None) -> Permit:
        """Check until admitted or ``wait_timeout`` passes; the caller releases."""
        timeout = self.wait_timeout if wait_timeout is None else \
            check_seconds(wait_timeout, "wait_timeout", zero=True, most=3600.0)
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            outcome = self.check()
            if isinstance(outcome, Permit):
                return outcome
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OverLimit(self)
            attempt += 1
            time.sleep(min(poll_pause(attempt, outcome.wait, self._rng), remaining))

    def try_acquire(self) -> Permit | None:
        """Check once, without waiting: a permit to release, or None."""
        outcome = self.check()
        return outcome if isinstance(outcome, Permit) else None

    def check(self) -> Permit | Refusal:
        """One check: one script, one round trip."""
        # From the kernel, not self._rng: a forked child copies the parent's
        # generator, and two processes drawing the same member would share a slot.
        member = os.urandom(8).hex()
        register = self._due_registration()
        state = self._keys()
        args = [*self._head(register), *self._args(member, state)]
        script_keys = [*state, keys.limiter_meta(self.name), keys.LIMITER_LIST]
        reply = self._run(lambda c: self.script.run(c, script_keys, args),
                          idempotent=self._replay_safe)
        admitted, used, extra = int(reply[0]), float(reply[1]), _text(reply[2])
        if register:
            self._registered_at = time.monotonic()
        if admitted:
            return Permit(self, float(extra), used, member)
        return Refusal(used, float(extra) if extra else None)

    def release(self, permit: Permit) -> None:
        """Nothing to free: the count decays with time (concurrent overrides)."""

    def renew(self, permit: Permit) -> bool:
        raise TypeError(f"a {self.kind} limiter has no lease to renew")

    # -- for the kinds ------------------------------------------------------------
    _replay_safe = False

    def _keys(self) -> list[str]:
        raise NotImplementedError

    def _args(self, member: str, state: list[str]) -> list[Any]:
        """The script's arguments after the shared head; ``state`` is what _keys gave."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The options written to ``lmtr:<name>``, under the Ruby ancestor's names."""
        raise NotImplementedError

    def _head(self, register: bool) -> list[Any]:
        if not register:
            return ["0", "", "", "", keys.LIMITER_TTL]
        options = json.dumps({**self.options(), "wait_timeout": _number(self.wait_timeout),
                              "ttl": keys.LIMITER_TTL}, separators=(",", ":"))
        return ["1", self.name, self.kind, options, keys.LIMITER_TTL]

    def _due_registration(self) -> bool:
        last = self._registered_at
        return last is None or time.monotonic() - last > REGISTER_EVERY

    def _run(self, block: Callable[[Conn], Any], *, idempotent: bool) -> Any:
        try:
            return pool_for(self.config).run(block, idempotent=idempotent)
        except rx.ResponseError as exc:
            error = self._state_error(str(exc))
            if error is None:
                raise
            raise error from exc

    def _state_error(self, message: str) -> LimiterStateError | None:
        if not message.startswith(("WURKLIMITER", "WRONGTYPE")) and \
                "not an integer" not in message:
            return None
        reason = message.removeprefix("WURKLIMITER ")
        return LimiterStateError(
            f"limiter {self.name!r}: {reason}; no limiter wrote that. Delete the key "
            f"(or run `wurk limiters reset {self.name}`) to start afresh")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: float) -> float | int:
    """Whole numbers as ints in the meta JSON (``30``, not ``30.0``), as Ruby writes them."""
    return int(value) if value == int(value) else value

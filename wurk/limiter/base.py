"""What every limiter shares: the waiting ``acquire``, permits, errors, registration.

Duties:
1. :class:`Limiter`: ``acquire()`` as a context manager that checks once
   (one Lua script, one round trip) and, while refused, waits with
   :func:`~wurk.limiter.policy.poll_pause` up to ``wait_timeout`` before it
   raises :class:`OverLimit`; ``try_acquire()`` checks once and never waits.
   ``async with limiter.acquire()`` (or ``await limiter.await_permit()``)
   checks through an async pool (:mod:`wurk.limiter.awaiting`) and awaits
   its pauses. A plain ``with`` on a thread that runs
   an event loop (an ``async def`` job that forgot the ``async``) never
   sleeps there: it checks once and raises OverLimit at once, so the job is
   rescheduled instead of stalling every task on the loop.
2. Registration: the first check of a limiter object, and one an hour
   after, also writes its ``lmtr:<name>`` hash and its name in ``lmtr-list``
   inside the same script, so ``wurk limiters`` lists it at no extra cost.
3. :class:`Permit`: what an admitted check returns; ``release()`` frees a
   concurrent slot (and is a no-op for the other kinds). A release Redis
   refused is kept (:mod:`wurk.wire.kept_writes`) and sent again until it
   lands or the slot's lease would have ended.
4. Errors: :class:`OverLimit` (a limit was reached), and
   :class:`LimiterStateError` for state in Redis that no limiter wrote (a
   wrong-type key, a counter that is not a number), with the key to delete.
5. The config is looked up at use, not at construction, so a module-level
   limiter follows a later ``wurk.configure``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.limiter.policy import (
    DEFAULT_RESCHEDULE,
    check_limiter_name,
    check_reschedule,
    check_seconds,
    overrated_count,
    poll_pause,
)
from wurk.redis.policy import redis_trouble
from wurk.redis.runtime import runtime_for
from wurk.settings.config import default_config
from wurk.wire import kept_writes, keys

if TYPE_CHECKING:
    from wurk.redis.apool import AsyncConn
    from wurk.redis.connection import Conn
    from wurk.redis.pool import RedisPool
    from wurk.settings.config import Config
    from wurk.wire.lua import Script

log = get_logger("wurk.limiter")
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
    # time.monotonic() when its lease last began, at the latest (a concurrent
    # slot's): taken before the check or renewal was sent.
    since: float = field(default=0.0, repr=False)

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
        self.name = check_limiter_name(name)
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
    def acquire(self, wait_timeout: float | None = None) -> Acquisition:
        """``with`` (or ``async with``) it: wait up to ``wait_timeout`` (default:
        the limiter's) for room, run the block, then release; raises
        :class:`OverLimit` when no room came."""
        return Acquisition(self, wait_timeout)

    def timeout_of(self, wait_timeout: float | None) -> float:
        if wait_timeout is None:
            return self.wait_timeout
        return check_seconds(wait_timeout, "wait_timeout", zero=True, most=3600.0)

    def wait(self, wait_timeout: float | None = None) -> Permit:
        """Check until admitted or ``wait_timeout`` passes; the caller releases."""
        timeout = self.timeout_of(wait_timeout)
        if timeout > 0 and _on_event_loop():
            log.warning("limiter.blocking_on_loop", limiter=self.name,
                        hint="use `async with limiter.acquire()` in async code")
            timeout = 0.0  # one check: a sleep here would stall every task on the loop
        deadline = time.monotonic() + timeout
        for attempt in itertools.count(1):
            step = self.next_step(self.check(), attempt, deadline)
            if isinstance(step, Permit):
                return step
            time.sleep(step)
        raise AssertionError("unreachable")  # pragma: no cover

    def next_step(self, outcome: Permit | Refusal, attempt: int, deadline: float) -> Permit | float:
        """After check number ``attempt``: the permit, or the pause before the next
        check; raises :class:`OverLimit` once ``deadline`` (monotonic) has passed."""
        if isinstance(outcome, Permit):
            return outcome
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OverLimit(self)
        return min(poll_pause(attempt, outcome.wait, self._rng), remaining)

    async def await_permit(self, wait_timeout: float | None = None) -> Permit:
        """``wait`` for async code: the checks go through an async pool and the
        pauses are awaited, so the loop runs other tasks meanwhile."""
        import asyncio  # noqa: PLC0415 - loaded already when a coroutine runs this

        deadline = time.monotonic() + self.timeout_of(wait_timeout)
        for attempt in itertools.count(1):
            step = self.next_step(await self.acheck(), attempt, deadline)
            if isinstance(step, Permit):
                return step
            await asyncio.sleep(step)
        raise AssertionError("unreachable")  # pragma: no cover

    async def acheck(self) -> Permit | Refusal:
        """One check on the running loop's pool for this limiter."""
        request = self.check_request()
        reply = await self._arun(self.script, request.keys, request.args,
                                 idempotent=self._replay_safe)
        return self.reading(request, reply)

    async def arelease(self, permit: Permit) -> None:
        """``permit.release()`` for async code; a failure is left to the lease."""
        if permit.released:
            return
        permit.released = True
        request = self.release_request(permit)
        if request is None:
            return
        try:
            # Replay-safe: a second ZREM finds nothing (it may count one overage).
            await self._arun(*request, idempotent=True)
        except Exception as exc:  # noqa: BLE001 - kept and sent again, or left to the lease
            self.release_refused(permit, request, exc)

    async def _arun(self, script: Script, script_keys: list[str], args: list[Any], *,
                    idempotent: bool) -> Any:
        from wurk.limiter import awaiting  # noqa: PLC0415 - import wurk stays free of asyncio

        async def block(conn: AsyncConn) -> Any:
            return await conn.script(script, script_keys, args)
        try:
            return await awaiting.pool(self, self.config).run(block, idempotent=idempotent)
        except rx.ResponseError as exc:
            error = self._state_error(str(exc))
            if error is None:
                raise
            raise error from exc

    def try_acquire(self) -> Permit | None:
        """Check once, without waiting: a permit to release, or None."""
        outcome = self.check()
        return outcome if isinstance(outcome, Permit) else None

    def check(self) -> Permit | Refusal:
        """One check: one script, one round trip."""
        request = self.check_request()
        reply = self._run(lambda c: self.script.run(c, request.keys, request.args),
                          idempotent=self._replay_safe)
        return self.reading(request, reply)

    def check_request(self) -> CheckRequest:
        """The script's keys and arguments for one check (no I/O)."""
        # From the kernel, not self._rng: a forked child copies the parent's
        # generator, and two processes drawing the same member would share a slot.
        member = os.urandom(8).hex()
        register = self._due_registration()
        state = self._keys()
        return CheckRequest(member, register, [*state, keys.limiter_meta(self.name),
                                               keys.LIMITER_LIST],
                            [*self._head(register), *self._args(member, state)])

    def reading(self, request: CheckRequest, reply: Any) -> Permit | Refusal:
        """What the script's reply says: admitted (a permit) or refused."""
        admitted, used, extra = int(reply[0]), float(reply[1]), _text(reply[2])
        if request.register:
            self._registered_at = time.monotonic()
        if admitted:
            return Permit(self, float(extra), used, request.member, since=request.sent)
        return Refusal(used, float(extra) if extra else None)

    def release(self, permit: Permit) -> None:
        """Nothing to free: the count decays with time (concurrent overrides)."""

    def release_request(self, permit: Permit) -> tuple[Script, list[str], list[Any]] | None:
        """The script that frees ``permit``'s slot, or None when nothing holds one."""
        return None

    def release_refused(self, permit: Permit, request: tuple[Script, list[str], list[Any]],
                        exc: Exception) -> None:
        """A release Redis refused: kept and sent again until it lands or the
        slot's lease would have freed it anyway (never raised into the block,
        so it cannot hide the block's own outcome)."""
        lease = self.lease_of()
        kept = redis_trouble(exc) and lease > 0
        log.warning("limiter.release_failed", limiter=self.name,
                    error=f"{type(exc).__name__}: {exc}", retrying=kept)
        if kept:
            script, release_keys, args = request
            kept_writes.keep(self._pool(), script, release_keys, args,
                             until=permit.since + lease, what="limiter_release")

    def lease_of(self) -> float:
        """How long a permit holds its slot without a release (0: no slot)."""
        return 0.0

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

    def _pool(self) -> RedisPool:
        # Looked up at use, as the config is: a module-level limiter follows
        # a later wurk.configure (duty 5).
        return runtime_for(self.config).pool

    def _run(self, block: Callable[[Conn], Any], *, idempotent: bool) -> Any:
        try:
            return self._pool().run(block, idempotent=idempotent)
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


@dataclass(frozen=True)
class CheckRequest:
    member: str
    register: bool
    keys: list[str]
    args: list[Any]
    sent: float = field(default_factory=time.monotonic)


class Acquisition:
    """What ``acquire()`` returns: a permit for a ``with`` or an ``async with`` block."""

    def __init__(self, limiter: Limiter, wait_timeout: float | None) -> None:
        self.limiter = limiter
        self.timeout = limiter.timeout_of(wait_timeout)
        self.permit: Permit | None = None

    def __enter__(self) -> Permit:
        self.permit = self.limiter.wait(self.timeout)
        return self.permit

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.permit is not None:
            self.permit.release()

    async def __aenter__(self) -> Permit:
        self.permit = await self.limiter.await_permit(self.timeout)
        return self.permit

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self.permit is not None:
            await self.limiter.arelease(self.permit)


def _on_event_loop() -> bool:
    """Whether this thread is running an asyncio event loop (never imports asyncio)."""
    events = sys.modules.get("asyncio.events")
    return events is not None and events._get_running_loop() is not None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: float) -> float | int:
    """Whole numbers as ints in the meta JSON (``30``, not ``30.0``), as Ruby writes them."""
    return int(value) if value == int(value) else value

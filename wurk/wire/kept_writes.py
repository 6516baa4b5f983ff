"""Writes Redis refused, kept and sent again until they land or stop mattering.

Some writes must land even when Redis is out of reach at the moment they are
made: a release that frees something (a unique lock, a limiter's slot) which
would otherwise stay taken until its own TTL or lease ends. A caller that
could not send one hands it here as data (the pool to send it on, a script,
its keys and arguments, and the monotonic time past which it no longer
matters) and goes on; this
module knows no feature. Every write kept must be safe to send twice (a
compare-and-delete, a ZREM of the caller's own member).

Duties:
1. :func:`keep`: hold a write until it lands or its time is up, oldest
   first; the same write kept twice is held once (the later deadline wins).
   At most :data:`MAX_KEPT`; past that the oldest goes (its own TTL ends
   what it would have freed), with one log line per run of drops.
2. One service thread per process, started with the first write kept,
   sends every write kept for one pool in one pipeline (NOSCRIPT loads the
   script and sends again), drops those that landed or expired, and while
   any remain waits :data:`KEPT_BACKOFF` (a :class:`~wurk.core.backoff.Backoff`),
   longer after each failed pass; a write kept meanwhile does not cut that
   wait short, since Redis is what it waits for. An error reply (an OOM or
   ACL refusal, a wrong key type) keeps that write as an outage does: it is
   dropped only when its time is up.
3. :func:`flush`: one more pass at a stop, bounded by the stop's deadline on
   every pool it uses.
4. :func:`forget_after_fork`: a forked child keeps none of its parent's
   writes (they are the parent's to send) and starts no thread until it
   keeps one of its own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.core.threads import describe
from wurk.redis.policy import ErrorKind, classify, trouble_backoff

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.redis.pool import RedisPool
    from wurk.wire.lua import Script

log = get_logger("wurk.kept_writes")
MAX_KEPT = 10_000
# Writes per pipeline: a bounded request and reply however many are kept.
CHUNK = 500
# Between passes while Redis stays away: 0.5 s doubling to 10 s, jittered as
# any Redis retry, so a fleet that lost Redis together does not come back in step.
KEPT_BACKOFF = trouble_backoff(0.5, 10.0)

Key = tuple[int, str, tuple[str, ...], tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class KeptWrite:
    """One write: ``script`` over ``keys`` and ``args`` on ``pool``, worth sending
    until ``until``."""

    pool: RedisPool
    script: Script
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    until: float  # time.monotonic()
    what: str  # for the log lines: whose write it is ("unique_release", ...)

    def command(self) -> tuple[Any, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


class KeptWrites:
    """The process's kept writes and their sender; see the module docstring."""

    def __init__(self) -> None:
        self.forget_after_fork()

    def forget_after_fork(self) -> None:
        self._lock = threading.Lock()
        # One pass at a time: the stop's flush waits for the thread's pass.
        self._sending = threading.Lock()
        self._kept: OrderedDict[Key, KeptWrite] = OrderedDict()
        self._failures = 0
        self._dropping = False
        self.service = Service("kept-writes", self._pass, name="wurk-kept-writes",
                               failed=logged(log, "kept_writes.pass_failed", 1.0))

    def keep(self, pool: RedisPool, script: Script, keys: Sequence[str], args: Sequence[Any],
             *, until: float, what: str) -> None:
        write = KeptWrite(pool, script, tuple(keys), tuple(args), until, what)
        key: Key = (id(pool), script.sha, write.keys, write.args)
        with self._lock:
            held = self._kept.pop(key, None)
            self._kept[key] = write if held is None or held.until <= until else held
            dropped = self._trim()
            backing_off = self._failures > 0
            self.service.start()  # once: the first write kept starts it
        if dropped:
            log.warning("kept_writes.dropped", what=dropped.what, keys=list(dropped.keys)[:4],
                        kept=MAX_KEPT, reason="too many writes kept; what each frees "
                        "ends with its own TTL (further drops are not logged until "
                        "the backlog clears)")
        if not backing_off:
            self.service.wake()

    def _trim(self) -> KeptWrite | None:
        """Caller holds the lock: drop the oldest past the cap; the first drop of a run."""
        first = None
        while len(self._kept) > MAX_KEPT:
            _, dropped = self._kept.popitem(last=False)
            if not self._dropping:
                self._dropping, first = True, dropped
        return first

    def pending(self) -> int:
        with self._lock:
            return len(self._kept)

    def flush(self, deadline: float | None = None) -> bool:
        """One pass over everything kept (bounded by ``deadline``, monotonic);
        True when nothing is left."""
        timeout = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._sending.acquire(timeout=timeout):
            return False
        try:
            return self._send_all(deadline)
        finally:
            self._sending.release()

    def _send_all(self, deadline: float | None) -> bool:
        for pool_id, writes in self._due().items():
            if deadline is not None and time.monotonic() >= deadline:
                break
            self._send(pool_id, writes, deadline)
        with self._lock:
            empty = not self._kept
            if empty:
                self._dropping = False
        return empty

    def _due(self) -> dict[int, list[KeptWrite]]:
        """What to send now, by pool; what has expired is dropped on the way."""
        now = time.monotonic()
        by_pool: dict[int, list[KeptWrite]] = {}
        with self._lock:
            for key, write in list(self._kept.items()):
                if write.until < now:
                    del self._kept[key]
                else:
                    by_pool.setdefault(key[0], []).append(write)
        return by_pool

    def _send(self, pool_id: int, writes: list[KeptWrite], deadline: float | None) -> None:
        pool = writes[0].pool
        landed: list[KeptWrite] = []
        error: BaseException | None = None
        for start in range(0, len(writes), CHUNK):
            chunk = writes[start:start + CHUNK]

            def block(conn: Conn, chunk: list[KeptWrite] = chunk) -> list[Any]:
                return evaluate(conn, chunk)
            try:
                with pool.deadline.bounded(deadline) if deadline is not None else nullcontext():
                    # Replay-safe: every write kept is (see the module docstring).
                    replies = pool.run(block, idempotent=True)
            except Exception as exc:  # noqa: BLE001 - Redis still away: the next pass tries again
                error = exc
                break
            for write, reply in zip(chunk, replies, strict=True):
                if isinstance(reply, Exception):
                    error = error or reply
                else:
                    landed.append(write)
        self._landed(pool_id, landed)
        if error is not None:
            # Said once per outage; while it lasts, each later pass says it at debug.
            say = log.warning if self._failures == 0 else log.debug
            say("kept_writes.refused", writes=len(writes) - len(landed),
                what=sorted({w.what for w in writes}), error=describe(error), retrying=True)

    def _landed(self, pool_id: int, landed: list[KeptWrite]) -> None:
        if not landed:
            return
        with self._lock:
            for write in landed:
                key: Key = (pool_id, write.script.sha, write.keys, write.args)
                if self._kept.get(key) is write:
                    del self._kept[key]
        for what in sorted({w.what for w in landed}):
            log.info("kept_writes.landed", what=what,
                     writes=sum(1 for w in landed if w.what == what))

    def _pass(self) -> float | None:
        """Send what is kept; then sleep until the next is kept, or back off
        while some remain (Redis still away, or refusing them)."""
        if self.flush():
            self._failures = 0
            return None
        self._failures += 1
        return KEPT_BACKOFF.delay(self._failures)


class Scripted(Protocol):
    """A script call as :func:`evaluate` sends it (a :class:`KeptWrite`, a
    settlement's write): the script, and its EVALSHA command."""

    @property
    def script(self) -> Script: ...
    def command(self) -> tuple[Any, ...]: ...


def evaluate(conn: Conn, writes: Sequence[Scripted]) -> list[Any]:
    """Send ``writes`` in one pipeline; the replies, error replies in place. A
    script Redis lost (a restart, SCRIPT FLUSH) is loaded and its calls sent
    again at once; a replica's refusal is raised, so the pool finds the new
    primary and sends the whole pipeline again (each write is replay-safe)."""
    replies = conn.pipeline([write.command() for write in writes], raise_on_error=False)
    for reply in replies:
        if isinstance(reply, rx.ResponseError) and classify(reply) is ErrorKind.FAILOVER:
            raise reply
    lost = [i for i, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError)]
    if lost:
        for script in {writes[i].script.sha: writes[i].script for i in lost}.values():
            conn.call("SCRIPT", "LOAD", script.source)
        again = conn.pipeline([writes[i].command() for i in lost], raise_on_error=False)
        for i, reply in zip(lost, again, strict=True):
            replies[i] = reply
    return list(replies)


KEPT = KeptWrites()


def keep(pool: RedisPool, script: Script, keys: Sequence[str], args: Sequence[Any], *,
         until: float, what: str) -> None:
    """Keep a write Redis refused, to send again on ``pool`` until it lands or ``until``
    (monotonic)."""
    KEPT.keep(pool, script, keys, args, until=until, what=what)


def flush(deadline: float | None = None) -> bool:
    """At a stop: one more pass, by ``deadline`` (monotonic); True when nothing is left."""
    return KEPT.flush(deadline) if KEPT.pending() else True


def forget_after_fork() -> None:
    KEPT.forget_after_fork()

"""Waiting for Redis at start: an unreachable Redis is an outage, not a boot error.

Duties:
1. :func:`wait_for_redis`: PING until Redis answers, backing off by
   :data:`PAUSES` (0.5 s doubling to 10 s, no jitter), with one readable log
   line per failed attempt (``redis.unreachable``, the URL without its
   password) and one when Redis answers. Errors that waiting cannot fix
   (a wrong password, an ACL refusal) are raised at once.
2. :func:`wait_or_signal`: run that wait on a thread of its own while the
   caller's thread keeps reading signal numbers from its wakeup socket, so
   a TERM ends the wait at any moment, even in the middle of a dial.

URLs in its log lines go through :func:`wurk.core.redaction.redact_url`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wurk.core.backoff import Backoff
from wurk.core.logging import get_logger
from wurk.core.redaction import redact_url
from wurk.redis.policy import ErrorKind, PoolExhausted, classify

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool

log = get_logger("wurk.redis")
# As docs/explanation/internals.md states them, unjittered: a wait is one
# cheap PING, and each attempt's log line names the next delay.
PAUSES = Backoff(first=0.5, cap=10.0)
# How often a waiting process says it is still alive (see wait_for_redis).
ALIVE_EVERY = 1.0
# Sent on the owner's wakeup socket when the wait ends; no signal has number 0.
WAIT_OVER = 0


def waiting_helps(exc: BaseException) -> bool:
    """True for failures an outage explains: a refused or failed dial, a lost
    connection, a timeout, a server still loading or not (yet) the primary."""
    return isinstance(exc, PoolExhausted) or classify(exc) is not ErrorKind.OTHER


def wait_for_redis(pool: RedisPool, stop: threading.Event,
                   alive: Callable[[], None] | None = None) -> bool:
    """PING until Redis answers (True) or ``stop`` is set (False).

    ``alive`` is called at least once a second while waiting (a swarm child
    pulses its parent with it, so a child waiting out an outage is not taken
    for one that cannot boot)."""
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            # A bare checkout: no replays and no error-hook report, since
            # each attempt gets its own status line below.
            with pool.conn() as conn:
                conn.call("PING")
        except Exception as exc:
            if not waiting_helps(exc):
                raise
            delay = PAUSES.delay(attempt)
            log.warning("redis.unreachable", url=redact_url(pool.url), attempt=attempt,
                        retry_in=delay, error=f"{type(exc).__name__}: {exc}")
            _pause(stop, delay, alive)
            continue
        if attempt > 1:
            log.info("redis.reachable", url=redact_url(pool.url), attempts=attempt)
        return True
    return False


def _pause(stop: threading.Event, seconds: float, alive: Callable[[], None] | None) -> None:
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        if alive is not None:
            alive()
        stop.wait(min(left, ALIVE_EVERY))


def wait_or_signal(pool: RedisPool, reader: socket.socket, writer: socket.socket,
                   on_signal: Callable[[int], bool],
                   alive: Callable[[], None] | None = None) -> bool:
    """Wait for Redis while serving the signal numbers that arrive on ``reader``.

    ``writer`` is the other end of the wakeup socket; ``on_signal(number)``
    returns True to give up (TERM). Returns True once Redis answered, False
    when given up, and raises what Redis answered that waiting cannot fix.
    """
    stop = threading.Event()
    outcome: list[bool | BaseException] = []

    def wait() -> None:
        try:
            outcome.append(wait_for_redis(pool, stop, alive))
        except Exception as exc:  # noqa: BLE001 - handed to the owner's thread
            outcome.append(exc)
        with contextlib.suppress(OSError):
            writer.send(bytes([WAIT_OVER]))

    # A daemon: a TERM during a dial must not wait for the dial to end.
    threading.Thread(target=wait, name="wurk-redis-wait", daemon=True).start()
    try:
        while not outcome:
            for number in reader.recv(64):
                if number != WAIT_OVER and on_signal(number):
                    return False
    finally:
        stop.set()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]

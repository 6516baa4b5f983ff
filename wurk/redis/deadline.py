"""Time limits on Redis I/O: a deadline every wait honours, and a bounded dial.

Duties:
1. :class:`Deadline`: one monotonic deadline per pool (none by default),
   set for the span of a ``with deadline.bounded(at):`` block. A drain sets
   it so that no dial, read, checkout or retry pause of any thread runs past
   the drain's end; :meth:`Deadline.check` refuses to start I/O once it has
   passed (:class:`DeadlinePassed`), :meth:`Deadline.clip` shortens a socket
   or checkout timeout to the time left, :meth:`Deadline.allows` says
   whether a pause before a retry can end in time.
2. :func:`bounded_dial`: a connection class whose whole dial (TCP connect
   and, for ``rediss://``, the TLS handshake) is bounded by the connect
   timeout. redis-py runs the handshake on the read timeout, so a TLS dial
   to a plain port (which never answers the ClientHello) used to hang for
   the full read timeout on every attempt.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis.exceptions as rx


class DeadlinePassed(rx.ConnectionError):
    """The pool's deadline passed before the I/O started: nothing was sent."""


class Deadline:
    """A pool's deadline; ``None`` means every wait keeps its configured length."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.at: float | None = None
        self._clock = clock
        self._lock = threading.Lock()

    @contextmanager
    def bounded(self, at: float) -> Iterator[None]:
        """Bound every wait by ``at`` (the earlier of it and any outer bound) until exit."""
        with self._lock:
            previous = self.at
            self.at = at if previous is None else min(previous, at)
        try:
            yield
        finally:
            with self._lock:
                self.at = previous

    def left(self) -> float | None:
        at = self.at
        return None if at is None else at - self._clock()

    def check(self) -> None:
        left = self.left()
        if left is not None and left <= 0:
            raise DeadlinePassed("the drain's deadline for Redis has passed")

    def clip(self, timeout: float | None) -> float | None:
        """``timeout`` shortened to the time left (never below a millisecond)."""
        left = self.left()
        if left is None:
            return timeout
        left = max(0.001, left)
        return left if timeout is None else min(timeout, left)

    def allows(self, pause: float) -> bool:
        """Whether a pause of ``pause`` seconds still ends before the deadline."""
        left = self.left()
        return left is None or pause < left


@functools.cache
def bounded_dial(connection_class: type[Any]) -> type[Any]:
    """A subclass of ``connection_class`` whose dial runs on the connect timeout
    (one per class, however many pools use it)."""

    class BoundedDial(connection_class):  # type: ignore[misc]
        def _connect(self) -> Any:
            conn: Any = self
            read_timeout = conn.socket_timeout
            # The base class sets the socket's timeout to socket_timeout
            # right after the TCP connect, before any TLS handshake.
            conn.socket_timeout = conn.socket_connect_timeout
            try:
                sock = super()._connect()
            finally:
                conn.socket_timeout = read_timeout
            sock.settimeout(read_timeout)
            return sock

    BoundedDial.__name__ = BoundedDial.__qualname__ = f"Bounded{connection_class.__name__}"
    return BoundedDial

"""One Redis connection that knows whether a failure left anything applied.

Duties:
1. Dial before sending, so a failure to connect is provably unapplied
   (:class:`~wurk.redis.policy.ConnectError`), and count completed round
   trips, so the pool can tell a clean failure from a dirty one.
2. Notice, before reuse, an idle socket the server closed (a restart or a
   failover) and re-dial it while that is still safe, reporting it as a
   disruption.
3. Keep every dial and read inside the pool's deadline while one is set.
4. Send pipelines as one write and read every reply, keeping the stream in
   step even when a reply is an error.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions as rx

from wurk.redis.limits import Deadline
from wurk.redis.policy import ConnectError, ErrorKind, classify


def _load_peek() -> Callable[[int], bool] | None:
    """A check for "nothing to read, still open" on an idle socket: libc
    recv(fd, 1 byte, MSG_PEEK | MSG_DONTWAIT) through ctypes.PyDLL, which keeps
    the GIL. A Python socket call would release it, and on a busy worker each
    release can cost a wait of a whole switch interval."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        recv = ctypes.PyDLL(None, use_errno=True).recv
    except (OSError, AttributeError):
        return None
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    recv.restype = ctypes.c_ssize_t
    byte = ctypes.create_string_buffer(1)
    flags = socket.MSG_PEEK | socket.MSG_DONTWAIT
    would_block = {errno.EAGAIN, errno.EWOULDBLOCK}

    def quiet_and_open(fd: int) -> bool:
        return recv(fd, byte, 1, flags) < 0 and ctypes.get_errno() in would_block

    return quiet_and_open


quiet_and_open = _load_peek()


def _server_closed(raw: Any) -> bool:
    """True when an idle socket must be re-dialed: EOF, an error, or bytes
    nobody asked for (a reply out of step)."""
    if quiet_and_open is not None:
        try:
            return not quiet_and_open(raw._sock.fileno())
        except OSError:
            return True
    try:
        return bool(raw.can_read(0))
    except (rx.ConnectionError, OSError):
        return True


class Conn:
    """One checked-out connection. Dials before sending and counts round trips."""

    def __init__(self, raw: Any, on_redial: Callable[[], None] | None = None,
                 deadline: Deadline | None = None) -> None:
        self.raw = raw
        self.round_trips = 0
        self.pid = os.getpid()
        self._on_redial = on_redial
        self._deadline = deadline or Deadline()

    def _dial(self) -> None:
        self._deadline.check()
        raw: Any = self.raw
        if raw._sock is not None:
            # A socket the server closed while it sat idle in the pool reads
            # as EOF; find out now, while re-dialing is still provably safe.
            if not _server_closed(raw):
                return
            raw.disconnect()
            # The server dropped us while idle: a restart, or a failover
            # (Sentinel kills the clients of the servers it reconfigures).
            if self._on_redial is not None:
                self._on_redial()
        connect_timeout = raw.socket_connect_timeout
        raw.socket_connect_timeout = self._deadline.clip(connect_timeout)
        try:
            raw.connect()
        except (rx.AuthenticationError, rx.AuthorizationError):
            raise
        except (rx.RedisError, OSError) as exc:
            raise ConnectError(f"cannot connect to Redis: {exc}") from exc
        finally:
            raw.socket_connect_timeout = connect_timeout

    def _read_timeout(self, timeout: float | None) -> float | None:
        """The read timeout for one reply: as asked, clipped to the pool's deadline."""
        if self._deadline.at is None:
            return timeout
        return self._deadline.clip(timeout or self.raw.socket_timeout)

    def call(self, *args: Any, timeout: float | None = None) -> Any:
        """Send one command and return its reply (bytes, ints, lists)."""
        self._dial()
        timeout = self._read_timeout(timeout)
        self.raw.send_command(*args, check_health=False)
        try:
            reply = self.raw.read_response(timeout=timeout) if timeout else self.raw.read_response()
        except rx.ResponseError as exc:
            # A READONLY-style refusal applied nothing: it leaves the block clean.
            if classify(exc) is not ErrorKind.FAILOVER:
                self.round_trips += 1
            raise
        self.round_trips += 1
        return reply

    def pipeline(self, commands: Sequence[Sequence[Any]], *, transaction: bool = False,
                 raise_on_error: bool = True, timeout: float | None = None) -> list[Any]:
        """Send many commands in one write and read every reply: one round trip.

        With ``transaction`` they are wrapped in MULTI/EXEC and the EXEC reply
        is returned. Error replies are returned in place (or the first is
        raised after every reply has been read, keeping the stream in step).
        ``timeout`` replaces the read timeout for each reply (a WAIT inside).
        """
        if not commands:
            return []
        self._dial()
        timeout = self._read_timeout(timeout)
        wire = [("MULTI",), *commands, ("EXEC",)] if transaction else list(commands)
        self.raw.send_packed_command(self.raw.pack_commands(wire), check_health=False)
        replies: list[Any] = []
        for _ in wire:
            try:
                replies.append(self.raw.read_response(timeout=timeout) if timeout
                               else self.raw.read_response())
            except rx.ResponseError as exc:
                replies.append(exc)
        # As in call(): a batch the server refused outright (READONLY & co, or
        # a transaction whose EXEC never ran) applied nothing and leaves the block clean.
        if not _applied_nothing(replies, transaction):
            self.round_trips += 1
        if transaction:
            # A replica answers each queued write with READONLY and then EXEC
            # with EXECABORT; surface the READONLY so failover handling sees it.
            queued_errors = [r for r in replies[1:-1] if isinstance(r, rx.ResponseError)]
            if queued_errors and not isinstance(replies[-1], list):
                raise queued_errors[0]
            replies = replies[-1] if isinstance(replies[-1], list) else [replies[-1]]
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, rx.ResponseError):
                    raise reply
        return replies

    def close(self) -> None:
        self.raw.disconnect()


def _applied_nothing(replies: list[Any], transaction: bool) -> bool:
    if transaction:
        return not isinstance(replies[-1], list)
    return all(isinstance(r, rx.ResponseError) and classify(r) is ErrorKind.FAILOVER
               for r in replies)

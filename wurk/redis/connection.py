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
5. Hold what the asyncio connection (:class:`wurk.redis.apool.AsyncConn`)
   shares with this one, none of it I/O: the dial's error (:func:`dialing`),
   the idle-socket peek (:func:`peer_closed`), and what a batch of replies
   means (:func:`applied`, :func:`outcome`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis.exceptions as rx

from wurk.redis.deadline import Deadline
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


def peer_closed(sock: Any) -> bool | None:
    """Whether the server closed an idle socket (EOF, an error, or bytes nobody
    asked for: a reply out of step), peeked without blocking; None where the
    socket cannot be peeked."""
    if sock is None or quiet_and_open is None:
        return None
    try:
        return not quiet_and_open(sock.fileno())
    except OSError:
        return True


def _server_closed(raw: Any) -> bool:
    """True when an idle socket must be re-dialed."""
    closed = peer_closed(raw._sock)
    if closed is not None:
        return closed
    try:
        return bool(raw.can_read(0))
    except (rx.ConnectionError, OSError):
        return True


@contextmanager
def dialing() -> Iterator[None]:
    """Around a dial: a failure is a :class:`ConnectError` (nothing was sent),
    but a refused password or ACL, which no redial cures."""
    try:
        yield
    except (rx.AuthenticationError, rx.AuthorizationError):
        raise
    except (rx.RedisError, OSError) as exc:
        raise ConnectError(f"cannot connect to Redis: {exc}") from exc


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
        connect_timeout, read_timeout = raw.socket_connect_timeout, raw.socket_timeout
        raw.socket_connect_timeout = self._deadline.clip(connect_timeout)
        # redis-py reads the handshake's replies on the read timeout: a dial
        # under a drain's deadline must end by it too, not a read timeout later.
        raw.socket_timeout = self._deadline.clip(read_timeout)
        try:
            with dialing():
                raw.connect()
        finally:
            raw.socket_connect_timeout, raw.socket_timeout = connect_timeout, read_timeout
            if raw._sock is not None:
                raw._sock.settimeout(read_timeout)

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
        if applied(replies, transaction):
            self.round_trips += 1
        return outcome(replies, transaction=transaction, raise_on_error=raise_on_error)

    def close(self) -> None:
        self.raw.disconnect()


def applied(replies: list[Any], transaction: bool) -> bool:
    """Whether a batch's replies show it reached Redis: not when the server refused
    it outright (READONLY & co, or a transaction whose EXEC never ran), which
    applied nothing and so leaves the block clean."""
    if transaction:
        return isinstance(replies[-1], list)
    return not all(isinstance(r, rx.ResponseError) and classify(r) is ErrorKind.FAILOVER
                   for r in replies)


def outcome(replies: list[Any], *, transaction: bool, raise_on_error: bool) -> list[Any]:
    """The replies a batch gives its caller: EXEC's for a transaction, and the
    first error raised with ``raise_on_error``."""
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

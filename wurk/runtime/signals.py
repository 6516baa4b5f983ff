"""Signals as numbers on a socket: the wake-up loop every entry point shares.

A Python signal handler runs between bytecodes of the main thread, wherever
that thread happens to be: inside a lock, a log write, a Redis call. So no
entry point (``wurk run``, the ``wurk-swarm`` parent, a swarm child) does
anything in a handler. The handlers do nothing at all, and
``signal.set_wakeup_fd`` has the interpreter write each signal's number to
a socket, which the main thread reads when it is ready to act.

Duties:
1. :class:`SignalPipe` ``install``: a socket pair whose write end becomes
   the wakeup fd, do-nothing handlers for the ``handled`` signals, SIG_IGN
   for ``ignored`` and SIG_DFL for ``defaulted``; the previous wakeup fd and
   handlers are kept.
2. ``restore`` (or leaving the ``with`` block): the previous wakeup fd and
   handlers come back and both sockets close. A forked swarm child never
   restores: what it would restore is its parent's, and it leaves with
   ``os._exit`` anyway.
3. ``next(timeout)``: the next number, one at a time, or None when the
   timeout passed first.
4. :func:`poke`: write a number as if that signal had arrived (a stop
   requested by a thread, the end of a wait); it never blocks or raises.
5. :func:`serve`: the main thread's loop of a worker process (``wurk run``,
   a swarm child), given its table of signal number -> action: each number
   read runs its action; one that returns an exit status ends the loop with
   it. Numbers not in the table (0, a wake-up) are passed over.
   :func:`dispatch` is one step of it, for code that reads numbers its own
   way (a wait for Redis).

The ``reader`` and ``writer`` sockets stay public for code that reads the
same stream in its own way (``wurk.redis.wait.wait_or_signal``).
"""

from __future__ import annotations

import collections
import contextlib
import select
import signal
import socket
from collections.abc import Callable, Iterable, Mapping
from types import FrameType, TracebackType
from typing import Any

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
# What a signal does in a serve loop: None carries on, a number is the exit status.
Action = Callable[[], int | None]


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The handler of every handled signal: the wakeup fd already carries the number."""


def poke(writer: socket.socket, number: int) -> None:
    """Send ``number`` down ``writer`` as if that signal had arrived; never raises."""
    with contextlib.suppress(OSError):  # a full buffer already holds a wake-up
        writer.send(bytes([number]))


class SignalPipe:
    def __init__(self, handled: Iterable[int], *, ignored: Iterable[int] = (),
                 defaulted: Iterable[int] = ()) -> None:
        self.dispositions: dict[int, Handler] = {
            **{s: signal.SIG_DFL for s in defaulted},
            **{s: signal.SIG_IGN for s in ignored},
            **{s: _ignore for s in handled},
        }
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        self._pending: collections.deque[int] = collections.deque()
        self._previous_fd: int | None = None
        self._previous: dict[int, Handler] = {}

    def install(self) -> SignalPipe:
        """Route the signals to this pipe (from the main thread). Returns self."""
        self._previous_fd = signal.set_wakeup_fd(self.writer.fileno(),
                                                 warn_on_full_buffer=False)
        for signum, disposition in self.dispositions.items():
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, disposition)
        return self

    def restore(self) -> None:
        """Give back the previous wakeup fd and handlers, and close both sockets."""
        if self._previous_fd is not None:
            signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        for signum, previous in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            if previous is not None:
                signal.signal(signum, previous)
        self._previous.clear()
        self.reader.close()
        self.writer.close()

    def __enter__(self) -> SignalPipe:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.restore()

    def next(self, timeout: float | None = None) -> int | None:
        """The next number that arrived (block until one does, or for ``timeout``
        seconds); None when the timeout passed first."""
        if not self._pending:
            if timeout is not None and not _readable(self.reader, timeout):
                return None
            self._pending.extend(self.reader.recv(64))
        return self._pending.popleft() if self._pending else None

    def poke(self, number: int) -> None:
        poke(self.writer, number)


def _readable(sock: socket.socket, timeout: float) -> bool:
    # poll, not select: a process with many pipes may hold descriptors past 1024.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))


def dispatch(table: Mapping[int, Action], number: int | None) -> int | None:
    """Run the action ``table`` has for ``number``; its exit status, or None to carry on."""
    action = table.get(number) if number else None
    return None if action is None else action()


def serve(signals: SignalPipe, table: Mapping[int, Action]) -> int:
    """Act on each signal that arrives until an action returns an exit status; that status."""
    while (status := dispatch(table, signals.next())) is None:
        pass
    return status

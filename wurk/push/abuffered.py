"""Reliable push for the asyncio client: pushes made while Redis is
unreachable wait in memory, on the event loop.

The rules are :mod:`wurk.push.buffered`'s, with a task in place of a thread
and ``asyncio.sleep`` in place of every wait, so nothing blocks the loop.

Duties:
1. Send a push at once when nothing waits. If it fails while dialing (or the
   server refused it outright), nothing reached Redis: keep it in a bounded,
   ordered buffer instead of raising; once anything waits, later pushes
   queue behind it so order holds.
2. A full buffer raises :class:`~wurk.push.buffered.PushBufferFullError`;
   nothing is dropped silently.
3. A drainer task sends the buffer, oldest first, with doubling pauses,
   when Redis returns. A push whose outcome is unknown may have landed: it
   is reported and never sent again, except a replayable (replica-confirmed)
   push, kept until replicas confirm it, as in the sync buffer.
4. ``aclose``: one last flush within ``push_flush_timeout``; then stop the
   drainer (a send in flight gets up to ``send_timeout`` to finish) and write
   what is left to the spool through :func:`~wurk.push.buffered.spool_left`,
   as the sync buffer does at exit (and warns as it does of the first push
   kept for a Redis that never answered: :mod:`wurk.push.nowhere`).
5. A loop that ends without ``aclose`` (``asyncio.run`` cancels the drainer)
   leaves its pushes to the interpreter's exit hook, which spools them
   without a last try (the loop that could send them is gone).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import time
import weakref
from collections.abc import Awaitable
from typing import cast

from wurk.push.buffered import (
    DRAIN_BACKOFF,
    Backlog,
    PendingPush,
    noticed,
    report_dropped,
    spool_left,
    still_sending,
)
from wurk.push.nowhere import Notice
from wurk.push.spool import Destination
from wurk.settings.hooks import RedisErrorHook

POLL = 0.01  # how often a flush looks at the buffer


class AsyncPushBuffer:
    def __init__(self, capacity: int, flush_timeout: float, on_error: RedisErrorHook, *,
                 spool: Destination | None = None, send_timeout: float = 5.0,
                 notice: Notice | None = None) -> None:
        self.capacity = capacity
        self.flush_timeout = flush_timeout
        self.on_error = on_error
        self.spool = spool
        self.notice = notice
        # The spool file a PushSpooledWarning named, once one did.
        self._spool_name: str | None = None
        self.send_timeout = send_timeout
        self._pid = os.getpid()
        self._backlog = Backlog(capacity)
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        # The push a send is in flight for: at close it may land or not.
        self._sending: PendingPush | None = None
        _live_buffers.add(self)

    def __len__(self) -> int:
        return len(self._backlog)

    async def send(self, push: PendingPush) -> None:
        if self._backlog:
            self._keep(push)
            return
        try:
            await _sent(push)
        except Exception as exc:
            # Once aclose spooled the buffer, nothing would send a kept push.
            if self._closed or not push.worth_keeping(exc):
                raise
            self._spool_name = noticed(self.notice, push) or self._spool_name
            self._keep(push)
            self._backlog.note_kept(push, exc)

    def _keep(self, push: PendingPush) -> None:
        self._backlog.add(push)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(
                self._drain(), name="wurk-push-drainer")

    async def _drain(self) -> None:
        backoff = DRAIN_BACKOFF
        while self._backlog and not self._closed:
            push = self._backlog.head
            self._sending = push
            try:
                await _sent(push)
            except Exception as exc:  # noqa: BLE001 - the drainer outlives any one failure
                if push.worth_keeping(exc):
                    self._sending = None
                    backoff = backoff.increment()
                    await asyncio.sleep(backoff.pause())
                    continue
                report_dropped(push, exc, self.on_error)
            self._sending = None
            backoff = backoff.reset()
            self._backlog.done(push)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything buffered was sent; False if time ran out."""
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        while self._backlog:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL)
        return True

    async def aclose(self) -> None:
        """Flush within the flush timeout, then spool what is left; the drainer stops."""
        if self._backlog and not await self.flush():
            deadline = time.monotonic() + self.send_timeout
            self._closed = True
            while self._sending is not None and time.monotonic() < deadline:
                await asyncio.sleep(POLL)
            left = self.take_left()
            await asyncio.to_thread(spool_left, self.spool, left, self._spool_name)
        self._closed = True
        if self._drainer is not None:
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer

    def take_left(self) -> list[PendingPush]:
        """Close the buffer and take what waits in it."""
        self._closed = True
        if self._sending is not None:
            still_sending(self._sending)
        return self._backlog.take_all()

    def spool_at_exit(self) -> None:
        if self._pid == os.getpid() and self._backlog:
            spool_left(self.spool, self.take_left(), self._spool_name)


async def _sent(push: PendingPush) -> None:
    # An async client's pending push sends through a coroutine function.
    await cast(Awaitable[object], push.send(1))


_live_buffers: weakref.WeakSet[AsyncPushBuffer] = weakref.WeakSet()


def spool_async_buffers() -> None:
    """At interpreter exit: spool what buffers never closed with ``aclose`` still hold."""
    for buffer in list(_live_buffers):
        buffer.spool_at_exit()


atexit.register(spool_async_buffers)

"""A bounded pool of daemon threads whose calls an event loop awaits.

The asyncio executor (``wurk.runtime.aio_manager``) runs what must not block
its loop here: sync jobs, sync server middleware around async jobs, and the
Redis bookkeeping that follows a run (acknowledge, settle).

Duties:
1. :meth:`ThreadPool.call` runs ``fn(*args)`` on one of at most ``size``
   threads, in a copy of the caller's ``contextvars`` (the job's context
   travels with it), and returns an ``asyncio.Future`` resolved on the loop
   with its value or exception (``BaseException`` included: nothing a call
   raises ends a pool thread). :meth:`ThreadPool.submit` runs a call nobody
   awaits (it must handle its own errors).
2. Threads start as calls need them, up to ``size``, under
   :mod:`wurk.core.threads` (one that dies is logged and restarted).
   They are daemons: a sync job that never returns cannot hold the process
   past its drain deadline (its job was handed back by then), unlike
   ``concurrent.futures``, whose threads are joined at exit.
3. A call whose awaiter was cancelled still runs to its end (a thread cannot
   be interrupted); its outcome is dropped. A loop closed meanwhile drops it too.
4. :meth:`ThreadPool.take_queued` takes back the calls no thread started;
   :meth:`ThreadPool.stop` lets idle threads end, busy ones after their call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

from wurk.core import threads

# (loop, future, context, fn, args); loop and future are None for a call nobody awaits.
_Item = tuple[asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | None",
              contextvars.Context, Callable[..., Any], tuple[Any, ...]]


class ThreadPool:
    def __init__(self, size: int, name: str) -> None:
        self.size = max(1, size)
        self.name = name
        self._work: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._stopped = False

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on a pool thread; await the returned future (on the loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._grow()
        self._work.put((loop, future, contextvars.copy_context(), fn, args))
        return future

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a pool thread, awaited by nobody: ``fn`` must not raise."""
        self._grow()
        self._work.put((None, None, contextvars.copy_context(), fn, args))

    def _grow(self) -> None:
        with self._lock:
            if self._idle > 0 or len(self._threads) >= self.size or self._stopped:
                return
            index = len(self._threads)
            self._threads.append(threads.start(
                self.name, self._serve, stopped=lambda: self._stopped,
                name=f"wurk-{self.name}-{index}"))

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._work.get()
            finally:
                with self._lock:
                    self._idle -= 1
            if item is None:
                return
            loop, future, context, fn, args = item
            try:
                value, error = context.run(fn, *args), None
            except BaseException as exc:  # noqa: BLE001 - the awaiting coroutine gets it
                value, error = None, exc
            if loop is None or future is None:
                continue
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future, value, error)

    def take_queued(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Calls no thread has started yet, taken out of the queue (their awaiters
        are cancelled): a stop hands their jobs back rather than start them."""
        taken: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        sentinels = 0
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is None:
                sentinels += 1
                continue
            loop, future, _context, fn, args = item
            taken.append((fn, args))
            if loop is not None and future is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(future.cancel)
        for _ in range(sentinels):
            self._work.put(None)
        return taken

    def busy(self) -> int:
        """Threads running a call now."""
        with self._lock:
            return len(self._threads) - self._idle

    def stop(self) -> None:
        """Idle threads end now, busy ones after their call; later calls queue unserved."""
        with self._lock:
            self._stopped = True
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)


def _resolve(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return  # its awaiter was cancelled
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)

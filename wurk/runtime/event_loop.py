"""``async def`` jobs in a threads process: the process's event loop, and the wait on it.

Duties:
1. Own one event loop per process, run forever on a daemon thread that
   starts with the first async job (:func:`loop`). A fork drops the parent's
   (its thread did not come along: :func:`forget_after_fork`), so a swarm
   child starts its own; at exit the loop cancels what still runs and closes,
   so no "Task was destroyed but it is pending" is ever printed. A loop a
   job stopped wakes every thread waiting on it (their jobs fail, cancelled)
   and the next async job starts a new one.
2. :func:`blocking` turns a coroutine function into a plain callable: the
   processor thread that calls it schedules the coroutine on the loop and
   waits (on a C-level lock) for its outcome, which it returns or raises. So
   an async job goes through the sync path's options, retries, middleware,
   reliable fetch, recovery, poison pills and drains unchanged, and the task
   runs in a copy of the calling thread's ``contextvars``.
3. :func:`run_with_next` gives a coroutine (an async server middleware) a
   ``call_next`` that runs a sync step (the rest of the chain: sync
   middleware, a sync job) back on the processor thread that waits for it,
   so sync code never blocks the loop and the job timer still finds the job
   on the thread it watches. Each run has its own channel: a step a
   cancelled run left unserved is never run by a later job.
4. Time limits: the job timer calls :func:`cancel` before it would raise
   ``JobTimeout`` in a thread; when that thread waits on a coroutine, the
   task is cancelled instead (``CancelledError`` inside the job at its next
   ``await``) and the wait raises the ``JobTimeout``. An async exception
   would not reach a thread blocked in a lock until the lock was released,
   and a pending one keeps every thread of the process on CPython's slow
   path; so the wait also wakes by itself every :data:`POLL` seconds, and a
   JobTimeout raised in the thread just before it began waiting lands then.
5. :func:`cancel_all` at a stop: the coroutines the stopping Manager's
   threads wait on (the jobs it handed back) are cancelled (their late
   outcome is dropped anyway), so they do not run on unseen while the
   process exits; their wait raises :class:`HandedBack`. Another Launcher
   in the same process is left alone.
6. Nothing a job raises stops the loop: ``SystemExit`` and
   ``KeyboardInterrupt`` (which a task re-raises into its loop) leave the
   coroutine wrapped and are raised again in the waiting thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

# How long the exit hook lets cancelled tasks unwind before closing the loop.
EXIT_GRACE = 1.0
# How often a thread waiting on a coroutine wakes by itself (see _next).
POLL = 0.1


class _EscapedError(Exception):
    """Carries a job's SystemExit or KeyboardInterrupt out of its task."""


class HandedBack(Exception):  # noqa: N818 - what happened, not an error of the job's
    """An async job's task cancelled because a stop pushed the job back to its queue."""

    def __init__(self) -> None:
        super().__init__("cancelled: a stop pushed this job back to its queue")


class _Waiting:
    """One processor thread's wait on one task, and the channel it is woken through."""

    __slots__ = ("channel", "error", "instead", "task")

    def __init__(self, channel: queue.SimpleQueue[Any]) -> None:
        self.channel = channel
        self.task: asyncio.Task[Any] | None = None
        self.error: BaseException | None = None  # the task could not even be created
        self.instead: type[BaseException] | None = None  # what the wait raises once cancelled


class _Process:
    """This process's loop and waiting threads; a fork starts a fresh one."""

    def __init__(self) -> None:
        # Guards the loop's creation and the table of waiting threads (never
        # held across a wait, and never while taking another lock).
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.waiting: dict[int, _Waiting] = {}


_state = _Process()


def loop() -> asyncio.AbstractEventLoop:
    """The process's event loop, started on its own thread on first use."""
    state = _state
    with state.lock:
        if state.loop is None:
            new = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(new,), name="wurk-asyncio",
                                      daemon=True)
            thread.start()
            state.loop, state.thread = new, thread
        return state.loop


def _serve(target: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(target)
    try:
        target.run_forever()
    finally:
        _ended(target)


def _ended(target: asyncio.AbstractEventLoop) -> None:
    """The loop stopped (a job called ``loop.stop()``, or exit): no thread may wait on it.

    Its tasks are cancelled and given a moment to unwind, so each waiting
    thread wakes to a cancelled job (a failure, retried as usual); the next
    async job starts a new loop.
    """
    state = _state
    with state.lock:
        if state.loop is target:
            state.loop = state.thread = None
        stranded = list(state.waiting.values())
    pending = asyncio.all_tasks(target)
    for task in pending:
        task.cancel()
    if pending and not target.is_closed():
        target.run_until_complete(asyncio.wait(pending, timeout=EXIT_GRACE))
    target.close()
    for waiting in stranded:
        if waiting.task is None or not waiting.task.done():
            waiting.channel.put(waiting)  # its outcome: "never started" or not done


def blocking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A sync callable that runs ``fn(*args)`` on the process's loop and waits for it.

    What ``fn`` returns is awaited only if it is a coroutine: a decorator
    around a coroutine function may have run it already.
    """
    def call(*args: Any, **kwargs: Any) -> Any:
        outcome = fn(*args, **kwargs)
        return run(outcome) if inspect.iscoroutine(outcome) else outcome
    return call


NextStep = Callable[[], Coroutine[Any, Any, Any]]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on the process's loop; the calling thread waits for its outcome."""
    return _run(coro, queue.SimpleQueue())


def run_with_next(make: Callable[[NextStep], Coroutine[Any, Any, Any]],
                  step: Callable[[], Any]) -> Any:
    """Run ``make(call_next)`` on the loop, as :func:`run`; ``await call_next()``
    runs ``step()`` on this (waiting) thread and returns or raises its outcome."""
    channel: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def call_next() -> Any:
        future = asyncio.get_running_loop().create_future()
        channel.put((step, future))
        return await future

    return _run(make(call_next), channel)


def _run(coro: Coroutine[Any, Any, Any], channel: queue.SimpleQueue[Any]) -> Any:
    state = _state
    target = loop()
    if threading.current_thread() is state.thread:
        coro.close()  # waiting here for the loop's own work would hang the process
        raise RuntimeError("wurk cannot wait for a coroutine on its own event loop thread; "
                           "await it instead")
    waiting = _Waiting(channel)
    # A sync step of an outer run may start another run on this thread: the
    # outer one is not in the table while its step runs, so this one is alone.
    tid = threading.get_ident()
    scheduled = False
    try:
        target.call_soon_threadsafe(_start, coro, waiting)
        scheduled = True
        while True:
            with state.lock:
                state.waiting[tid] = waiting
            item = _next(waiting, target)
            with state.lock:
                state.waiting.pop(tid, None)
            if item is waiting:
                break
            _serve_request(target, *item)
    except BaseException:
        # A JobTimeout delivered before or during the wait, or the loop is
        # gone: the coroutine must not run on with nobody waiting for it.
        if not scheduled:
            coro.close()
        elif not target.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing runs it
                target.call_soon_threadsafe(_cancel, waiting)
        raise
    finally:
        with state.lock:
            state.waiting.pop(tid, None)
    return _outcome(waiting)


def _next(waiting: _Waiting, target: asyncio.AbstractEventLoop) -> Any:
    """The next item on the run's channel: its end (``waiting``) or a sync step.

    The wait wakes every :data:`POLL` seconds on its own, so this thread runs
    Python again: a JobTimeout the timer raised in it just before it began
    waiting (it was running sync code then) lands here at once, rather than
    staying pending (which keeps every thread of the process on CPython's
    slow path) until the coroutine ends, or for good if it never does. A
    loop closed without waking this wait (it began as the loop stopped)
    ends it too.
    """
    while True:
        try:
            return waiting.channel.get(timeout=POLL)  # C-level; a POLL-long quiet spell
        except queue.Empty:
            if target.is_closed():
                return waiting  # its outcome: done, or "the loop stopped"


def _serve_request(target: asyncio.AbstractEventLoop, step: Callable[[], Any],
                   future: asyncio.Future[Any]) -> None:
    try:
        value = step()
    except BaseException as exc:  # noqa: BLE001 - the awaiting coroutine gets it
        target.call_soon_threadsafe(_resolve, future, None, exc)
        return
    target.call_soon_threadsafe(_resolve, future, value, None)


def _resolve(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return  # its awaiter was cancelled meanwhile
    if exc is None:
        future.set_result(value)
    else:
        future.set_exception(exc)


async def _guarded(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _EscapedError() from exc


def _start(coro: Coroutine[Any, Any, Any], waiting: _Waiting) -> None:
    guarded = _guarded(coro)
    try:
        task = asyncio.ensure_future(guarded)
    except BaseException as exc:  # noqa: BLE001 - e.g. a task factory: the job fails
        guarded.close()  # neither was started: closed, not "never awaited"
        coro.close()
        waiting.error = exc
        waiting.channel.put(waiting)
        return
    waiting.task = task
    task.add_done_callback(lambda _t: waiting.channel.put(waiting))


def _cancel(waiting: _Waiting) -> None:
    if waiting.task is not None:
        waiting.task.cancel()


def _outcome(waiting: _Waiting) -> Any:
    task = waiting.task
    if waiting.error is not None:
        raise waiting.error
    if task is None or not task.done():
        raise RuntimeError("the event loop stopped before the async job could end")
    failure = None if task.cancelled() else task.exception()
    if isinstance(failure, _EscapedError) and failure.__cause__ is not None:
        raise failure.__cause__
    if waiting.instead is not None:
        raise waiting.instead() from failure
    # result() raises the job's exception, or CancelledError if something else cancelled it.
    return task.result()


def cancel(tid: int, timeout: type[BaseException]) -> bool:
    """Cancel the task thread ``tid`` waits on, its wait to raise ``timeout``.

    False when ``tid`` waits on no coroutine now (the caller raises in the
    thread instead: it runs sync code).
    """
    state = _state
    with state.lock:
        waiting = state.waiting.get(tid)
        if waiting is None or state.loop is None:
            return False
        _cancel_as(state.loop, waiting, timeout)
        return True


def _cancel_as(target: asyncio.AbstractEventLoop, waiting: _Waiting,
               instead: type[BaseException]) -> None:
    """Under the state lock: cancel, the wait to raise ``instead`` (the first reason
    given). Each request cancels again: a coroutine that swallowed a soft
    limit's cancellation is still stopped by a stop."""
    if waiting.instead is None:
        waiting.instead = instead
    target.call_soon_threadsafe(_cancel, waiting)


def cancel_all(tids: Iterable[int]) -> set[int]:
    """Cancel the tasks threads ``tids`` wait on (a stop gave their jobs back);
    returns the threads that were waiting on one.

    Only those threads: another Launcher in the same process runs on.
    """
    state, chosen = _state, set(tids)
    with state.lock:
        if state.loop is None:
            return set()
        mine = {tid: w for tid, w in state.waiting.items() if tid in chosen}
        for waiting in mine.values():
            _cancel_as(state.loop, waiting, HandedBack)
        return set(mine)


def waiting_threads() -> int:
    """How many threads wait on a coroutine now (for tests and status)."""
    with _state.lock:
        return len(_state.waiting)


def forget_after_fork() -> None:
    """In a forked child: the parent's loop thread is not here; the next job starts one."""
    _state.__init__()  # type: ignore[misc]


@atexit.register
def _close() -> None:
    """Cancel what still runs, let it unwind briefly, and close the loop."""
    state = _state
    with state.lock:
        target, thread = state.loop, state.thread
        state.loop = None
    if target is None or thread is None or not thread.is_alive():
        return

    async def wind_down() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_GRACE)
        asyncio.get_running_loop().stop()

    asyncio.run_coroutine_threadsafe(wind_down(), target)
    thread.join(EXIT_GRACE + 1.0)
    if not thread.is_alive():
        target.close()

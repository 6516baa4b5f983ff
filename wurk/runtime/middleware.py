"""Server middleware: code that wraps every job execution.

A middleware is a callable ``mw(payload, queue, call_next)`` that must call
``call_next()`` to run the rest of the chain and the job, or return without
calling it to skip the job (it then counts as done). Raising fails the job
as the job raising would.

Duties:
1. Run the chain, first middleware outermost, around the job.
2. An ``async def`` middleware (``await call_next()``) runs on the process's
   event loop (:mod:`wurk.runtime.event_loop`) while the processor thread waits;
   its ``call_next`` hands the rest of the chain back to that thread, so a
   sync middleware or job never blocks the loop.
3. Hold the running job's context (jid, class, queue) in a ``contextvars``
   variable for the whole chain: :func:`current_job` reads it from any code
   the job runs, sync or async, and concurrent jobs never see each other's.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wurk.runtime import event_loop
from wurk.settings.hooks import ServerMiddleware

_current: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "wurk_current_job", default=None)


def current_job() -> Mapping[str, Any] | None:
    """The payload of the job running in this context (None outside a job)."""
    return _current.get()


def is_async(middleware: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(middleware) or inspect.iscoroutinefunction(
        getattr(middleware, "__call__", None))  # noqa: B004 - the method, not callability


def invoke(chain: Sequence[ServerMiddleware], payload: Mapping[str, Any], queue: str,
           job: Callable[[], Any]) -> Any:
    """Run ``job`` inside every middleware of ``chain``, first one outermost."""
    token = _current.set(payload)
    try:
        if not chain:
            return job()
        return _step(chain, 0, payload, queue, job)
    finally:
        _current.reset(token)


def _step(chain: Sequence[ServerMiddleware], index: int, payload: Mapping[str, Any],
          queue: str, job: Callable[[], Any]) -> Any:
    if index == len(chain):
        return job()
    middleware = chain[index]

    def rest() -> Any:
        return _step(chain, index + 1, payload, queue, job)

    if is_async(middleware):
        return event_loop.run_with_next(
            lambda call_next: middleware(payload, queue, call_next), rest)
    return middleware(payload, queue, rest)

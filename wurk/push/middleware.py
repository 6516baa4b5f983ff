"""Client middleware: code that runs before every push, in this process.

A middleware is a callable ``mw(job_class, payload, queue, redis, call_next)``
(Sidekiq's client middleware, in Python's shape): ``job_class`` is the
payload's ``class``, ``payload`` the job about to be written (a dict it may
change in place, ``at`` included for a scheduled job), ``queue`` its queue
and ``redis`` the client's pool. It calls ``call_next()`` to go on down the
chain and then push; returning without calling it stops this push (the job
is not written, and ``push`` returns None). Raising fails the push: nothing
of it is written. This is the shape of the server chain
(:mod:`wurk.runtime.middleware`); periodic and tracing features hook in
here rather than special-casing the client.

Duties:
1. Run the chain around one payload, first one outermost (the push
   pipeline's second stage, :mod:`wurk.push.pipeline`).
2. Say whether the push goes ahead (every middleware called ``call_next()``,
   down to the end of the chain), stopped, or deferred (:func:`run`,
   :func:`defer`).

What wurk itself does to a push after the chain (the unique lock, the batch
count) is no middleware: those are the pipeline's built-in steps
(:mod:`wurk.push.steps`), which ask Redis through the client's own pool.
The application's chain is sync in both clients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from wurk.settings.hooks import ClientMiddleware

Outcome = Literal["write", "stop", "defer"]


@dataclass
class _Deferral:
    resume: Callable[[], object]
    taken: bool = False


# The push whose chain is running in this thread or task (a job pushed from a
# middleware has its own, restored when that inner push returns).
_deferral: ContextVar[_Deferral | None] = ContextVar("wurk_push_deferral", default=None)


def defer() -> Callable[[], object]:
    """For a middleware about to return without ``call_next()`` because the job
    must be written later: the push under way then returns the payload's jid
    (allocated before the chain ran) rather than None. Returns the function
    that pushes the payload later through the same client, and through the
    whole chain again, so the deferring middleware must let that pass through.
    """
    current = _deferral.get()
    if current is None:
        raise RuntimeError("wurk.push.middleware.defer() is for a client middleware, "
                           "during a push")
    current.taken = True
    return current.resume


def run(chain: Sequence[ClientMiddleware], payload: dict[str, Any], redis: Any,
        resume: Callable[[], object]) -> Outcome:
    """Run ``payload`` through ``chain``: write it now, stop, or (a middleware
    called :func:`defer`) leave it to ``resume``, called later."""
    deferral = _Deferral(resume)
    token = _deferral.set(deferral)
    try:
        if invoke(chain, payload, redis):
            return "write"
        return "defer" if deferral.taken else "stop"
    finally:
        _deferral.reset(token)


def invoke(chain: Sequence[ClientMiddleware], payload: dict[str, Any], redis: Any) -> bool:
    """Run ``payload`` through ``chain``; True when the push should go ahead."""
    reached_end = False

    def step(index: int) -> None:
        nonlocal reached_end
        if index == len(chain):
            reached_end = True
            return
        chain[index](str(payload.get("class")), payload, str(payload.get("queue")), redis,
                     lambda: step(index + 1))

    step(0)
    return reached_end

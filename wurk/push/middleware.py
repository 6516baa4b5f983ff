"""Client middleware: code that runs before every push, in this process.

A middleware is a callable ``mw(job_class, payload, queue, redis, call_next)``
(Sidekiq's client middleware, in Python's shape): ``job_class`` is the
payload's ``class``, ``payload`` the job about to be written (a dict it may
change in place, ``at`` included for a scheduled job), ``queue`` its queue
and ``redis`` the client's pool. It calls ``call_next()`` to go on down the
chain and then push; returning without calling it stops this push (the job
is not written, and ``push`` returns None). Raising fails the push: nothing
of it is written. This is the shape of the server chain
(:mod:`wurk.runtime.middleware`); periodic, unique and tracing features hook
in here rather than special-casing the client.

Duties:
1. Run ``config.client_middleware`` around one payload, first one outermost,
   then wurk's built-in middleware, each only for a payload that carries its
   field when the application's chain is done with it (unique jobs' lock,
   on ``unique_for``): a push without such a field pays a dict lookup.
2. Say whether the push goes ahead: only when every middleware called
   ``call_next()``, down to the end of the chain.
3. ``unwritten``: when payloads that went through the chain are not written
   after all (the write raised, or a later job of the same bulk batch did),
   let each built-in give back what it took for them (the unique lock), so
   a push the caller tries again is not refused as its own duplicate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push import unique
from wurk.settings.hooks import ClientMiddleware
from wurk.wire.unique import FOR as UNIQUE_FOR

log = get_logger("wurk.client")


@dataclass(frozen=True)
class BuiltIn:
    field: str  # runs only for a payload carrying this field
    run: ClientMiddleware
    give_back: Callable[[dict[str, Any], Any], object]


# Run innermost, after the application's chain, so the lock is taken on the
# arguments as they will be written, just before the write.
BUILT_IN: tuple[BuiltIn, ...] = (BuiltIn(UNIQUE_FOR, unique.lock, unique.unlock),)
_FIELDS = tuple(b.field for b in BUILT_IN)


def wanted(chain: Sequence[ClientMiddleware], payload: dict[str, Any]) -> bool:
    """Whether a push needs the chain: middleware configured, or a built-in's field."""
    if chain:
        return True
    # One dict lookup per built-in: the whole cost of an unused one.
    for name in _FIELDS:  # noqa: SIM110 - any() with a generator costs several lookups' worth
        if name in payload:
            return True
    return False


def invoke(chain: Sequence[ClientMiddleware], payload: dict[str, Any], redis: Any) -> bool:
    """Run ``payload`` through ``chain``; True when the push should go ahead."""
    reached_end = False

    def step(index: int) -> None:
        nonlocal reached_end
        if index < len(chain):
            mw = chain[index]
        else:
            # A built-in runs only if its field is there once the chain has run.
            while index - len(chain) < len(BUILT_IN) and \
                    BUILT_IN[index - len(chain)].field not in payload:
                index += 1
            if index - len(chain) == len(BUILT_IN):
                reached_end = True
                return
            mw = BUILT_IN[index - len(chain)].run
        mw(str(payload.get("class")), payload, str(payload.get("queue")), redis,
           lambda: step(index + 1))

    step(0)
    return reached_end


def unwritten(payloads: Iterable[dict[str, Any]], redis: Any) -> None:
    """Give back what built-ins took for payloads that were not written. Raises nothing:
    the caller is already raising the reason the push failed."""
    for payload in payloads:
        for built_in in BUILT_IN:
            if built_in.field not in payload:
                continue
            try:
                built_in.give_back(payload, redis)
            except Exception as exc:  # noqa: BLE001 - what was taken expires on its own
                log.warning("client.give_back_failed", jid=payload.get("jid"),
                            field=built_in.field, error=describe(exc))

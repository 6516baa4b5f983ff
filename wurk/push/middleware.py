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
1. Run ``config.client_middleware`` around one payload, first one outermost.
2. Say whether the push goes ahead (every middleware called ``call_next()``,
   down to the end of the chain), stopped, or deferred (:func:`run`).
3. ``admit``: after the chain, just before the write, run wurk's built-in
   steps on the payloads about to be written (one push, or a bulk batch of up
   to a thousand), each only on the payloads that carry its field (unique
   jobs' lock, on ``unique_for``), in one round trip for the batch; a
   payload without such a field costs a dict lookup per built-in.
4. ``unwritten``: when payloads that went through ``admit`` are not written
   after all (the write raised), let each built-in give back what it took
   for them (the unique lock), so a push the caller tries again is not
   refused as its own duplicate.
5. ``aadmit`` and ``aunwritten``: the same built-in steps for the asyncio
   client (:mod:`wurk.push.aclient`), awaited on its pool; a step with no
   async form runs its sync one on a worker thread, off the event loop. The
   application's chain itself is sync in both clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.push import batch_step, unique
from wurk.settings.hooks import ClientMiddleware
from wurk.wire.batch import FIELD as BATCH_FIELD
from wurk.wire.unique import FOR as UNIQUE_FOR

log = get_logger("wurk.client")
Prepared = tuple[dict[str, Any], "float | None"]


@dataclass(frozen=True)
class BuiltIn:
    field: str  # a payload carrying this field goes through this step
    admit: Callable[[Sequence[Prepared], Any], list[bool]]  # True: written
    give_back: Callable[[Iterable[dict[str, Any]], Any], object]
    # The same two for the asyncio client, on its pool. A step without them
    # runs its sync pair on a worker thread with the sync pool, off the loop.
    aadmit: Callable[[Sequence[Prepared], Any], Awaitable[list[bool]]] | None = None
    agive_back: Callable[[Iterable[dict[str, Any]], Any], Awaitable[object]] | None = None


# Run after the application's chain, so the lock is taken on the arguments as
# they will be written, just before the write. A batch counts its jobs last,
# so a duplicate the unique step refused is never counted. The batch step has
# no async form: the asyncio client runs it on a worker thread.
BUILT_IN: tuple[BuiltIn, ...] = (
    BuiltIn(UNIQUE_FOR, unique.admit, unique.give_back, unique.aadmit, unique.agive_back),
    BuiltIn(BATCH_FIELD, batch_step.admit, batch_step.give_back),
)


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


def admit(batch: list[Prepared], redis: Callable[[], Any]) -> list[Prepared]:
    """The payloads of ``batch`` the built-in steps let through, in order;
    ``redis()`` gives the pool, asked for only when a step has work."""
    for built_in in BUILT_IN:
        mine = _carrying(batch, built_in.field)
        if mine:
            batch = _without_refused(batch, mine,
                                     built_in.admit([batch[i] for i in mine], redis()))
    return batch


async def aadmit(batch: list[Prepared], redis: Any,
                 sync_redis: Callable[[], Any]) -> list[Prepared]:
    """:func:`admit` for the asyncio client: each step through its pool
    (``redis``), or a step with no async form on a thread with ``sync_redis()``."""
    for built_in in BUILT_IN:
        mine = _carrying(batch, built_in.field)
        if not mine:
            continue
        chosen = [batch[i] for i in mine]
        verdicts = (await built_in.aadmit(chosen, redis) if built_in.aadmit is not None
                    else await asyncio.to_thread(built_in.admit, chosen, sync_redis()))
        batch = _without_refused(batch, mine, verdicts)
    return batch


def _carrying(batch: list[Prepared], field: str) -> list[int]:
    for payload, _ in batch:
        if field in payload:
            break
    else:
        return []  # the whole cost of a step no payload asks for
    return [i for i, (payload, _) in enumerate(batch) if field in payload]


def _without_refused(batch: list[Prepared], mine: list[int],
                     verdicts: list[bool]) -> list[Prepared]:
    refused = {i for i, ok in zip(mine, verdicts, strict=True) if not ok}
    return [job for i, job in enumerate(batch) if i not in refused] if refused else batch


def unwritten(payloads: Iterable[dict[str, Any]], redis: Any) -> None:
    """Give back what built-ins took for payloads that were not written. Raises nothing:
    the caller is already raising the reason the push failed."""
    for built_in, mine in _taken(payloads):
        try:
            built_in.give_back(mine, redis)
        except Exception as exc:  # noqa: BLE001 - what was taken expires on its own
            _give_back_failed(built_in, mine, exc)


async def aunwritten(payloads: Iterable[dict[str, Any]], redis: Any,
                     sync_redis: Callable[[], Any]) -> None:
    """:func:`unwritten` for the asyncio client (as :func:`aadmit` picks its pools)."""
    for built_in, mine in _taken(payloads):
        try:
            if built_in.agive_back is not None:
                await built_in.agive_back(mine, redis)
            else:
                await asyncio.to_thread(built_in.give_back, mine, sync_redis())
        except Exception as exc:  # noqa: BLE001 - what was taken expires on its own
            _give_back_failed(built_in, mine, exc)


def _taken(payloads: Iterable[dict[str, Any]]) -> Iterator[tuple[BuiltIn, list[dict[str, Any]]]]:
    """Each built-in with the payloads that carry its field (skipping those with none)."""
    chosen = list(payloads)
    for built_in in BUILT_IN:
        mine = [payload for payload in chosen if built_in.field in payload]
        if mine:
            yield built_in, mine


def _give_back_failed(built_in: BuiltIn, mine: list[dict[str, Any]], exc: Exception) -> None:
    log.warning("client.give_back_failed", jids=[p.get("jid") for p in mine][:10],
                field=built_in.field, error=describe(exc))

"""The push pipeline: every push, one job or a bulk slice, takes the same way.

1. **Normalise** (:mod:`wurk.push.prepare`): the item into the payload
   written and its run time: defaults, checks, jid, timestamps.
2. **Client middleware**: the application's chain (:mod:`wurk.push.middleware`),
   which may change, stop or defer the push; what it returns is checked
   again as a push would be, since it may have changed anything.
3. **Built-in steps** (:mod:`wurk.push.steps`): the unique lock and the
   batch count, each on the payloads that carry its field.
4. **One writer** (:mod:`wurk.push.writer`).

Each stage is visited once per push. ``push_bulk`` is the same pipeline
over slices of :data:`~wurk.push.prepare.BULK_BATCH` jobs; a bulk item no
chain and no step has work for is normalised once for the whole slice and
serialised around its args and jids (:mod:`wurk.push.bulk_template`),
then written by the same writer.

Nothing here does I/O: stage 2 runs the application's code, and stages 3
and 4 are a flow (:mod:`wurk.push.exchange`) that :class:`wurk.Client` and
:class:`wurk.AsyncClient` each drive on their own pool. When the write
fails, what the steps took is given back, unless the jobs may have landed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wurk.push import bulk_template, middleware, prepare, steps
from wurk.push.confirmed import ConfirmedPush
from wurk.push.exchange import Flow
from wurk.push.prepare import Prepared
from wurk.push.writer import Writer
from wurk.settings.config import Config
from wurk.settings.hooks import ClientMiddleware

# A push a middleware deferred is written later by this: the client's push.
Resume = Callable[[dict[str, Any]], object]
Routed = Prepared | str | None  # the payload; a deferred push's jid; None: stopped


class Normalise(Protocol):
    def __call__(self, item: Mapping[str, Any], now: float, *,
                 checked: bool = False) -> Prepared: ...


@dataclass(frozen=True)
class Slice:
    """One bulk slice on its way: routed payloads for the steps, or a
    templated slice's jobs, already serialised (no step has work for them)."""

    bulk: prepare.BulkSlice
    content: ConfirmedPush | None = None

    def jids(self, written: Sequence[Prepared]) -> list[str]:
        return list(self.content.jids) if self.content is not None else self.bulk.jids(written)


class Pipeline:
    """One client's pipeline on ``config``; ``middleware``: its own chain (None:
    the config's, read at each push)."""

    def __init__(self, config: Config, middleware: Sequence[ClientMiddleware] | None,
                 writer: Writer, normalise: Normalise | None = None) -> None:
        self.config = config
        self.timestamps = config.timestamps
        # A feature that needs a step of its own (the periodic loop's tick
        # guard) builds a client with the config's chain plus that step.
        self._middleware = None if middleware is None else list(middleware)
        self.writer = writer
        # Stage 1; a client may name its own (``Client.normalise``, which the
        # scheduler also uses on what it promotes).
        self.normalise: Normalise = normalise or self._normalise

    def chain(self) -> Sequence[ClientMiddleware]:
        return self.config.client_middleware if self._middleware is None else self._middleware

    def _normalise(self, item: Mapping[str, Any], now: float, *,
                   checked: bool = False) -> Prepared:
        return prepare.normalise(item, now, self.timestamps, checked=checked)

    # -- stages 1 and 2 ------------------------------------------------------
    def route(self, item: Mapping[str, Any], now: float, redis: Any, resume: Resume, *,
              checked: bool = False) -> Routed:
        """``item`` normalised and through the chain. ``redis``: what a middleware
        is given; ``checked``: the args were checked already (a bulk push)."""
        prepared = self.normalise(item, now, checked=checked)
        chain = self.chain()
        if not chain:
            return prepared
        payload, run_at = prepared
        if run_at is not None:
            payload["at"] = run_at  # as Sidekiq's middleware sees a scheduled job
        outcome = middleware.run(chain, payload, redis, lambda: resume(payload))
        if outcome != "write":
            return str(payload["jid"]) if outcome == "defer" else None
        # A middleware may have changed anything, ``at`` and ``args`` included.
        return prepare.normalise(payload, now, self.timestamps)

    def slices(self, item: Mapping[str, Any], now: float, redis: Any,
               resume: Resume) -> Iterator[Slice]:
        """A ``push_bulk`` item, checked whole first, as its slices through stages 1 and 2."""
        if bulk_template.applies(item, self.chain()):
            pushes = bulk_template.slices(item, now, self.timestamps)
            if pushes is not None:
                return (Slice(prepare.BulkSlice(), push) for push in pushes)
        return (self._routed(items, now, redis, resume)
                for items in prepare.bulk_slices(item, now, self.timestamps))

    def _routed(self, items: list[dict[str, Any]], now: float, redis: Any,
                resume: Resume) -> Slice:
        bulk = prepare.BulkSlice()
        for one in items:
            bulk.add(self.route(one, now, redis, resume, checked=True))
        return Slice(bulk)

    # -- stages 3 and 4 ------------------------------------------------------
    def send(self, batch: list[Prepared],
             content: ConfirmedPush | None = None) -> Flow[list[Prepared]]:
        """The built-in steps, then the write: the payloads written. ``content``:
        a templated slice's jobs (``batch`` then empty). On failure, what the
        steps took is given back."""
        skip = self.writer.skip
        admitted: list[Prepared] = []
        sent = False
        try:
            admitted = yield from steps.admit(batch, skip)
            if content is None and admitted:
                content = prepare.as_push(admitted)
            if content is not None:
                sent = True
                yield from self.writer.write(content, [p for p, _ in admitted])
        except BaseException as exc:
            taken = ([p for p, _ in admitted or batch] if batch
                     else [{"jid": jid} for jid in content.jids] if content else [])
            yield from steps.give_back(taken, skip, exc if sent else None)
            raise
        return admitted

    def send_slice(self, piece: Slice) -> Flow[list[str]]:
        """A bulk slice through stages 3 and 4: its jids written or deferred, in order."""
        written = yield from self.send(piece.bulk.batch, piece.content)
        return piece.jids(written)

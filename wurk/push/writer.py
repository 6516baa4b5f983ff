"""The push pipeline's one writer: how a client's pushes reach Redis.

One writer per client, chosen from its settings once; each write is a flow
(:mod:`wurk.push.exchange`) that the client drives on its own pool, so the
sync and the asyncio client write the same way.

Duties:
1. Plain (no buffer, no replicas to confirm): :func:`wurk.push.landing.write`,
   marked so a lost reply is replayed without a twin; a push whose payloads
   carry a ``bid`` counts them in the same script
   (:func:`wurk.batches.push.write_flow`), so such a client skips the
   count-first batch step (:attr:`Writer.skip`).
2. Replica-confirmed: :class:`~wurk.push.confirmed.ConfirmedWriter`'s write,
   tried ``redis_retry_attempts`` times (each waits ``push_replicas_timeout``),
   under the nonce of any earlier attempt (:func:`wurk.push.landing.write_confirmed`).
3. Buffered: the push is handed to the client's buffer (:class:`Hand`), which
   sends it now (one pool attempt a send) or keeps it while Redis is away; a
   confirmed one is replayable there until replicas confirm it.
4. An error's ``retry()`` sends the same push again through ``rerun``: the
   client's driver, so a sync client's retry is a call and an async one's an
   awaitable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wurk.batches import push as batch_push
from wurk.batches.keys import FIELD as BATCH_FIELD
from wurk.push import landing
from wurk.push.buffered import PendingPush
from wurk.push.confirmed import ConfirmedPush, ConfirmedWriter, PushNotConfirmedError
from wurk.push.exchange import Aside, Flow
from wurk.settings.config import Config


@dataclass(frozen=True)
class Hand(Aside):
    """A push for the client's buffer: ``flow(attempts)`` writes it once."""

    flow: Callable[[int | None], Flow[Any]]
    content: ConfirmedPush
    replayable: bool  # sending it again after an unknown outcome cannot enqueue twice

    def pending(self, send: Callable[[int], object]) -> PendingPush:
        """What the buffer keeps: ``send(attempts)`` drives :attr:`flow`."""
        return PendingPush(send, self.content.jids, replayable=self.replayable,
                           content=self.content)


def for_config(config: Config, *, buffered: bool,
               rerun: Callable[[Flow[Any]], object]) -> Writer:
    """The writer ``config`` asks for: confirmed when it names replicas to wait for."""
    replicas = config.replicas_to_confirm
    confirmed = (ConfirmedWriter(replicas, config.push_replicas_timeout,
                                 config.redis_read_timeout) if replicas else None)
    return Writer(buffered=buffered, confirmed=confirmed, tries=config.redis_retry_attempts,
                  rerun=rerun)


class Writer:
    def __init__(self, *, buffered: bool, confirmed: ConfirmedWriter | None, tries: int,
                 rerun: Callable[[Flow[Any]], object]) -> None:
        self.buffered = buffered
        self.confirmed = confirmed
        self.tries = tries
        self._rerun = rerun
        # A plain write counts batch jobs itself: the built-in batch step is skipped.
        self.skip: tuple[str, ...] = (BATCH_FIELD,) if not buffered and confirmed is None else ()

    def write(self, content: ConfirmedPush, payloads: Sequence[dict[str, Any]] = ()
              ) -> Flow[Any]:
        """The write of ``content`` (made of ``payloads``, when they went through the steps)."""
        if self.buffered:
            return self._handed(content)
        if self.confirmed is not None:
            return landing.write_confirmed(content, self._confirm, self._resend_confirmed)
        if self.skip and any(BATCH_FIELD in payload for payload in payloads):
            return batch_push.write_flow(content, payloads)
        return landing.write(content, self._resend)

    def _handed(self, content: ConfirmedPush) -> Flow[None]:
        yield Hand(lambda attempts: self._once(content, attempts), content,
                   replayable=self.confirmed is not None)

    def _once(self, content: ConfirmedPush, attempts: int | None) -> Flow[Any]:
        """One send of a buffered push, on at most ``attempts`` of the pool's tries."""
        if self.confirmed is not None:
            return self.confirmed.flow(content, self._resend_one, attempts=attempts)
        return landing.write(content, self._resend, attempts=attempts)

    def _confirm(self, content: ConfirmedPush) -> Flow[None]:
        """An unbuffered confirmed push: ``tries`` tries, each waiting for the replicas."""
        assert self.confirmed is not None
        for left in reversed(range(self.tries)):
            try:
                yield from self.confirmed.flow(content, self._resend_one)
                return
            except PushNotConfirmedError:
                if not left:
                    raise

    def _resend(self, content: ConfirmedPush) -> object:
        return self._rerun(landing.write(content, self._resend))

    def _resend_one(self, content: ConfirmedPush) -> object:
        assert self.confirmed is not None
        return self._rerun(self.confirmed.flow(content, self._resend_one))

    def _resend_confirmed(self, content: ConfirmedPush) -> object:
        return self._rerun(landing.write_confirmed(content, self._confirm,
                                                   self._resend_confirmed))

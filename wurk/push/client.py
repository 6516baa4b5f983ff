"""The client: builds Sidekiq payloads and puts them in Redis.

Duties:
1. ``push`` one job and ``push_bulk`` many (one pipelined round trip per
   thousand), immediate or scheduled, with payloads exactly as the spec
   describes (jid, class, args, queue, retry, created_at, enqueued_at),
   each through the push pipeline (:mod:`wurk.push.pipeline`): normalise,
   the client middleware, the built-in steps (unique lock, batch count),
   then this client's one writer (:mod:`wurk.push.writer`). The pipeline
   decides and this client drives it on its sync pool
   (:func:`wurk.push.exchange.drive`), as :class:`wurk.AsyncClient` drives
   the same pipeline on its own.
2. Refuse non-JSON arguments before anything reaches Redis, and in
   ``push_bulk`` arguments that do not fit a job this process defines.
3. Write plainly by default (:mod:`wurk.push.landing`): a lost reply is
   replayed without a twin, and a push that stays unknown raises
   :class:`~wurk.push.landing.PushOutcomeUnknown`, which a push of the same
   jid retries safely. With ``push_replicas``, each push waits for that many
   replicas and is safe to send again (:mod:`wurk.push.confirmed`).
4. With ``reliable_push``, hand each push to the buffer
   (:class:`~wurk.push.buffered.PushBuffer`) with its jobs and a nonce, so
   the exit path can spool it; at start, push in the background what
   earlier processes left in the spool (:mod:`wurk.push.spool_drain`),
   unless told not to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from wurk.push import prepare, writer
from wurk.push.buffered import PushBuffer, send_timeout
from wurk.push.confirmed import ConfirmedWriter, PushNotConfirmedError
from wurk.push.exchange import Aside, Flow, drive
from wurk.push.nowhere import Notice
from wurk.push.pipeline import Pipeline
from wurk.push.prepare import BULK_BATCH, Prepared
from wurk.push.spool import Destination
from wurk.push.spool_drain import drain_at_start
from wurk.push.writer import Hand
from wurk.redis.runtime import Runtime, handed
from wurk.settings.config import Config, default_config
from wurk.settings.hooks import ClientMiddleware
from wurk.wire import keys

__all__ = ["BULK_BATCH", "Client", "PushNotConfirmedError", "forget_default_client"]

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool

T = TypeVar("T")


class Client:
    def __init__(self, config: Config | None = None, *, pool: RedisPool | None = None,
                 buffered: bool | None = None, drain_spool: bool = True,
                 middleware: Sequence[ClientMiddleware] | None = None,
                 runtime: Runtime | None = None) -> None:
        self.config = c = config or default_config()
        # Looked up once: a push does no lookup, only I/O on this pool.
        self._pool = pool if pool is not None else handed(runtime, c).pool
        spool = Destination.of(c)
        self.buffer = (PushBuffer(self.pool, c.push_buffer_size, c.push_flush_timeout,
                                  spool=spool, send_timeout=send_timeout(c),
                                  notice=Notice(self.pool.url, self._answered, spool))
                       if (c.reliable_push if buffered is None else buffered) else None)
        self.writer = writer.for_config(c, buffered=self.buffer is not None, rerun=self._drive)
        self.pipeline = Pipeline(c, middleware, self.writer, self._normalise)
        if drain_spool:
            drain_at_start(c, self.pool)

    @property
    def confirmed(self) -> ConfirmedWriter | None:
        """The replica-confirmed writer, when ``push_replicas`` asks for one."""
        return self.writer.confirmed

    @property
    def pool(self) -> RedisPool:
        return self._pool

    def _answered(self) -> bool:
        return self.pool.replay.answered

    _default: Client | None = None
    _default_pid = 0
    # The testing mode's client (``wurk.testing``): while set, every push of
    # the enqueue verbs goes to it, and none reaches Redis.
    stand_in: ClassVar[Client | None] = None

    @classmethod
    def default(cls) -> Client:
        """This process's client on the default config (rebuilt after a fork, and
        after ``wurk.configure`` installs another config)."""
        if Client.stand_in is not None:
            return Client.stand_in
        current = cls._default
        if (current is None or cls._default_pid != os.getpid()
                or current.config is not default_config()):
            if current is not None and current.buffer is not None and len(current.buffer):
                # Pushes still waiting for Redis: kept reachable, so the exit
                # flush sends or spools them.
                _retired.append(current)
            current = cls._default = Client()
            cls._default_pid = os.getpid()
        return current

    # -- pushing ----------------------------------------------------------
    def push_job(self, name: str, args: list[Any], options: JobOptions, *,
                 delay: float | None = None, at: float | None = None) -> str | None:
        return self.push(prepare.job_item(name, args, options, delay=delay, at=at))

    def push(self, item: Mapping[str, Any]) -> str | None:
        """Push one job. ``item`` needs ``class`` and ``args``; ``at`` schedules it.

        Unknown keys are kept. Returns the jid, or None when a client
        middleware stopped the push (one that deferred it gives the jid).
        """
        routed = self.pipeline.route(item, time.time(), self.pool, self.push)
        if not isinstance(routed, tuple):
            return routed  # None (stopped) or the jid of a deferred push
        return str(routed[0]["jid"]) if self._drive(self.pipeline.send([routed])) else None

    def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class: ``item["args"]`` is a list of arg lists.

        ``at`` may be one time for all or a list with one per job. Returns the
        jids of the jobs pushed (a client middleware may stop some). Client
        middleware runs a thousand jobs at a time, just before they are
        written: one that raises leaves the earlier thousands pushed.
        """
        jids: list[str] = []
        for piece in self.pipeline.slices(item, time.time(), self.pool, self.push):
            jids += self._drive(self.pipeline.send_slice(piece))
        return jids

    def normalise(self, item: Mapping[str, Any], now: float, *, checked: bool = False) -> Prepared:
        return prepare.normalise(item, now, self.config.timestamps, checked=checked)

    def prepared(self, item: Mapping[str, Any]) -> Prepared | str | None:
        """``item`` as a push would write it, through the client middleware (None:
        stopped; a str: a deferred push's jid): for a writer of its own, such as
        a workflow's one-script launch (:mod:`wurk.workflows.client`)."""
        return self.pipeline.route(item, time.time(), self.pool, self.push)

    def _normalise(self, item: Mapping[str, Any], now: float, *,
                   checked: bool = False) -> Prepared:
        # Stage 1 is this client's ``normalise``, looked up at each push: the
        # scheduler checks what it promotes with the same one.
        return self.normalise(item, now, checked=True) if checked else self.normalise(item, now)

    # -- driving the pipeline's flows ----------------------------------------
    def _drive(self, flow: Flow[T]) -> T:
        return drive(self.pool, flow, self._hand)

    def _hand(self, hand: Aside) -> None:
        """A buffered push: the buffer sends it now, or keeps it while Redis is away."""
        assert isinstance(hand, Hand) and self.buffer is not None
        self.buffer.send(hand.pending(lambda attempts: drive(self.pool, hand.flow(attempts))))

    def push_raw(self, queue: str, raw: str | bytes) -> None:
        """Put an already-serialised payload back on its queue, oldest end first."""
        self.pool.pipeline([("SADD", keys.QUEUES, queue), ("RPUSH", keys.queue(queue), raw)])


_retired: list[Client] = []


def forget_default_client() -> None:
    """Drop the process's default client (a forked child)."""
    Client._default = None
    _retired.clear()

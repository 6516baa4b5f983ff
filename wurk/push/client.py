"""The client: builds Sidekiq payloads and puts them in Redis.

Duties:
1. ``push`` one job and ``push_bulk`` many (one pipelined round trip per
   thousand), immediate or scheduled, with payloads exactly as the spec
   describes (jid, class, args, queue, retry, created_at, enqueued_at),
   each through the client middleware chain (:mod:`wurk.push.middleware`)
   first, which may change or stop it, then through the built-in steps
   (``admit``: unique jobs' locks) just before the write; what those took
   for a payload that is provably not written after all is given back
   (``unwritten``). A plain write of jobs of a batch counts them in the
   same script (:func:`wurk.push.batch_step.write`).
2. Refuse non-JSON arguments before anything reaches Redis, and in
   ``push_bulk`` arguments that do not fit a job this process defines.
3. Declare apply-safety: an immediate push (SADD + LPUSH) is never replayed
   after a round trip may have landed; a scheduled push (ZADD of one exact
   member) is idempotent and may be.
4. With ``push_replicas``, write through :mod:`wurk.push.confirmed` instead: each
   push waits for that many replicas and is safe to send again.
5. Give every buffered push its jobs and a nonce, so the exit path can
   spool it; at start, push in the background what earlier processes left
   in the spool (:mod:`wurk.push.spool_drain`), unless told not to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wurk.push import batch_step, bulk_template, middleware, prepare
from wurk.push.buffered import PendingPush, PushBuffer
from wurk.push.confirmed import ConfirmedPush, ConfirmedWriter, PushNotConfirmedError
from wurk.push.prepare import BULK_BATCH, Prepared
from wurk.push.spool import Destination
from wurk.push.spool_drain import drain_at_start
from wurk.redis.pools import pool_for
from wurk.settings.config import Config, default_config
from wurk.settings.hooks import ClientMiddleware
from wurk.wire import keys
from wurk.wire.batch import FIELD as BATCH_FIELD

__all__ = ["BULK_BATCH", "Client", "PushNotConfirmedError", "forget_default_client"]

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool



class Client:
    def __init__(self, config: Config | None = None, *, pool: RedisPool | None = None,
                 buffered: bool | None = None, drain_spool: bool = True,
                 middleware: Sequence[ClientMiddleware] | None = None) -> None:
        self.config = config or default_config()
        self._pool = pool
        # The chain this client runs (default: the config's, read at each
        # push); a feature that needs a step of its own (the periodic loop's
        # tick guard) builds a client with the config's chain plus that step.
        self._middleware = None if middleware is None else list(middleware)
        use_buffer = self.config.reliable_push if buffered is None else buffered
        self.buffer = self._buffer() if use_buffer else None
        replicas = self.config.replicas_to_confirm
        self.confirmed = (ConfirmedWriter(replicas, self.config.push_replicas_timeout,
                                          self.config.redis_read_timeout)
                          if replicas else None)
        # A plain write counts batch jobs itself: the built-in batch step is skipped.
        self._skip = (BATCH_FIELD,) if self.buffer is None and self.confirmed is None else ()
        if drain_spool:
            drain_at_start(self.config, self.pool)

    def _buffer(self) -> PushBuffer:
        c = self.config
        # One send: a dial, a reply, and the replicas' confirmation.
        send_timeout = c.redis_connect_timeout + c.redis_read_timeout + c.push_replicas_timeout
        return PushBuffer(self.pool, c.push_buffer_size, c.push_flush_timeout,
                          spool=Destination.of(c), send_timeout=send_timeout)

    @property
    def pool(self) -> RedisPool:
        return self._pool or pool_for(self.config)

    _default: Client | None = None
    _default_pid = 0

    @classmethod
    def default(cls) -> Client:
        """This process's client on the default config (rebuilt after a fork, and
        after ``wurk.configure`` installs another config)."""
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

    # -- high level -------------------------------------------------------
    def push_job(self, name: str, args: list[Any], options: JobOptions, *,
                 delay: float | None = None, at: float | None = None) -> str | None:
        return self.push(prepare.job_item(name, args, options, delay=delay, at=at))

    def push(self, item: Mapping[str, Any]) -> str | None:
        """Push one job. ``item`` needs ``class`` and ``args``; ``at`` schedules it.

        Unknown keys are kept. Returns the jid, or None when a client
        middleware stopped the push (one that deferred it gives the jid).
        """
        now = time.time()
        prepared = self._through_middleware(self.normalise(item, now), now)
        if not isinstance(prepared, tuple):
            return prepared  # None (stopped) or the jid of a deferred push
        sent = False
        try:
            if not middleware.admit([prepared], lambda: self.pool, self._skip):
                return None
            sent = True
            self._write_mixed([prepared])
        except BaseException as exc:
            middleware.unwritten([prepared[0]], self.pool, skip=self._skip,
                                 written_error=exc if sent else None)
            raise
        return str(prepared[0]["jid"])

    def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class: ``item["args"]`` is a list of arg lists.

        ``at`` may be one time for all or a list with one per job. Returns the
        jids of the jobs pushed (a client middleware may stop some). Client
        middleware runs a thousand jobs at a time, just before they are
        written: one that raises leaves the earlier thousands pushed.
        """
        now = time.time()
        if bulk_template.applies(item, self._chain()):
            pushes = bulk_template.slices(item, now, self.config.timestamps)
            if pushes is not None:
                jids: list[str] = []
                for push in pushes:
                    try:
                        jids += self._write(push)
                    except BaseException as exc:
                        # Nothing to give back; said as every other push says it.
                        middleware.unwritten(({"jid": jid} for jid in push.jids), self.pool,
                                             written_error=exc)
                        raise
                return jids
        jids = []
        for items in prepare.bulk_slices(item, now, self.config.timestamps):
            bulk = prepare.BulkSlice()
            batch: list[Prepared] = []
            sent = False
            try:
                for one in items:
                    bulk.add(self._through_middleware(self.normalise(one, now, checked=True),
                                                      now))
                batch = middleware.admit(bulk.batch, lambda: self.pool, self._skip)
                if batch:
                    sent = True
                    self._write_mixed(batch)
            except BaseException as exc:
                middleware.unwritten((p for p, _ in batch or bulk.batch), self.pool,
                                     skip=self._skip, written_error=exc if sent else None)
                raise
            jids.extend(bulk.jids(batch))
        return jids

    # -- building payloads ----------------------------------------------
    def normalise(self, item: Mapping[str, Any], now: float, *, checked: bool = False) -> Prepared:
        return prepare.normalise(item, now, self.config.timestamps, checked=checked)

    def prepared(self, item: Mapping[str, Any]) -> Prepared | str | None:
        """``item`` as a push would write it, through the client middleware (None:
        stopped; a str: a deferred push's jid): for a writer of its own, such as
        a workflow's one-script launch (:mod:`wurk.push.workflow`)."""
        now = time.time()
        return self._through_middleware(self.normalise(item, now), now)

    def _chain(self) -> Sequence[ClientMiddleware]:
        return self.config.client_middleware if self._middleware is None else self._middleware

    def _through_middleware(self, prepared: Prepared, now: float) -> Prepared | str | None:
        return prepare.through_middleware(self._chain(), prepared, now, self.config.timestamps,
                                          self.pool, resume=self.push)

    # -- writing ----------------------------------------------------------
    def _write_mixed(self, batch: Sequence[Prepared]) -> None:
        content = prepare.as_push(batch)
        if (self.buffer is None and self.confirmed is None
                and any(BATCH_FIELD in p for p, _ in batch)):
            batch_step.write(content, (p for p, _ in batch), self.pool)
            return
        self._write(content)

    def _write(self, content: ConfirmedPush) -> tuple[str, ...]:
        """Write jobs no built-in step counts; returns their jids."""
        jids = content.jids
        if self.confirmed is not None:
            self._write_confirmed(self.confirmed, content)
            return jids
        commands, idempotent = prepare.plain_commands(content)
        if self.buffer is None:
            self.pool.pipeline(commands, idempotent=idempotent)
        else:
            self.buffer.send(PendingPush(
                lambda attempts: self.pool.pipeline(commands, idempotent=idempotent,
                                                    attempts=attempts), jids,
                content=content))
        return jids

    def _write_confirmed(self, writer: ConfirmedWriter, push: ConfirmedPush) -> None:
        if self.buffer is not None:
            # An unconfirmed push waits in the buffer, which sends it again
            # (a no-op where it already landed) until replicas confirm it.
            self.buffer.send(PendingPush(
                lambda attempts: writer.write(self.pool, push, attempts=attempts),
                push.jids, replayable=True, content=push))
            return
        tries = self.config.redis_retry_attempts
        for attempt in range(1, tries + 1):
            try:
                writer.write(self.pool, push)
                return
            except PushNotConfirmedError:
                # Each try already waited push_replicas_timeout for the replicas.
                if attempt == tries:
                    raise

    def push_raw(self, queue: str, raw: str | bytes) -> None:
        """Put an already-serialised payload back on its queue, oldest end first."""
        self.pool.pipeline([("SADD", keys.QUEUES, queue), ("RPUSH", keys.queue(queue), raw)])


_retired: list[Client] = []


def forget_default_client() -> None:
    """Drop the process's default client (a forked child)."""
    Client._default = None
    _retired.clear()

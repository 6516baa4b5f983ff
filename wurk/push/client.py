"""The client: builds Sidekiq payloads and puts them in Redis.

Duties:
1. ``push`` one job and ``push_bulk`` many (one pipelined round trip per
   thousand), immediate or scheduled, with payloads exactly as the spec
   describes (jid, class, args, queue, retry, created_at, enqueued_at),
   each through the client middleware chain (:mod:`wurk.push.middleware`)
   first, which may change or stop it, then through the built-in steps
   (``admit``: unique jobs' locks) just before the write; what those took
   for a payload that is not written after all is given back
   (``unwritten``).
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

from wurk.push import middleware, signatures
from wurk.push.buffered import PendingPush, PushBuffer
from wurk.push.confirmed import ConfirmedPush, ConfirmedWriter, PushNotConfirmedError, QueuedJob
from wurk.push.spool import Destination
from wurk.push.spool_drain import drain_at_start
from wurk.push.time_options import stamp_expiry
from wurk.redis.pools import pool_for
from wurk.settings.config import Config, default_config
from wurk.settings.hooks import ClientMiddleware
from wurk.wire import keys
from wurk.wire.payload import check_args, dumps, new_jid, now_stamp, score

if TYPE_CHECKING:
    from wurk.push.options import JobOptions
    from wurk.redis.pool import RedisPool

# Sidekiq's rule: a perform_in interval below this is relative, above it absolute.
ABSOLUTE_THRESHOLD = 1_000_000_000
BULK_BATCH = 1000


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
        """This process's client on the default config (rebuilt after a fork)."""
        if cls._default is None or cls._default_pid != os.getpid():
            cls._default = Client()
            cls._default_pid = os.getpid()
        return cls._default

    # -- high level -------------------------------------------------------
    def push_job(self, name: str, args: list[Any], options: JobOptions, *,
                 delay: float | None = None, at: float | None = None) -> str | None:
        item: dict[str, Any] = {**options.payload_fields(), "class": name, "args": args}
        if delay is not None:
            # Sidekiq's perform_in rule: under 1e9 an interval, else an epoch.
            seconds = float(delay)
            item["at"] = seconds if seconds >= ABSOLUTE_THRESHOLD else time.time() + seconds
        elif at is not None:
            item["at"] = at
        return self.push(item)

    def push(self, item: Mapping[str, Any]) -> str | None:
        """Push one job. ``item`` needs ``class`` and ``args``; ``at`` schedules it.

        Unknown keys are kept. Returns the jid, or None when a client
        middleware stopped the push (one that deferred it gives the jid).
        """
        now = time.time()
        prepared = self._through_middleware(self.normalise(item, now), now)
        if not isinstance(prepared, tuple):
            return prepared  # None (stopped) or the jid of a deferred push
        try:
            if not middleware.admit([prepared], lambda: self.pool):
                return None
            self._write([prepared[0]], prepared[1])
        except BaseException:
            middleware.unwritten([prepared[0]], self.pool)
            raise
        return str(prepared[0]["jid"])

    def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class: ``item["args"]`` is a list of arg lists.

        ``at`` may be one time for all or a list with one per job. Returns the
        jids of the jobs pushed (a client middleware may stop some). Client
        middleware runs a thousand jobs at a time, just before they are
        written: one that raises leaves the earlier thousands pushed.
        """
        all_args = item.get("args")
        if not isinstance(all_args, list) or not all(isinstance(a, list) for a in all_args):
            raise TypeError("push_bulk needs 'args' as a list of argument lists")
        ats = item.get("at")
        if isinstance(ats, list) and len(ats) != len(all_args):
            raise ValueError("push_bulk 'at' list must have one time per job")
        # Check every job before writing any, so a bad one pushes nothing.
        name = str(item.get("class"))
        for i, args in enumerate(all_args):
            check_args(args, f"args[{i}]")
            signatures.check(name, args, f" in args[{i}]")
        now = time.time()
        created = now_stamp(self.config.timestamps, now)
        jids: list[str] = []
        for start in range(0, len(all_args), BULK_BATCH):
            batch: list[tuple[dict[str, Any], float | None]] = []
            order: list[str] = []
            deferred: set[str] = set()
            try:
                for i in range(start, min(start + BULK_BATCH, len(all_args))):
                    one = _bulk_item(item, all_args[i], ats[i] if isinstance(ats, list) else ats,
                                     created)
                    prepared = self._through_middleware(self.normalise(one, now), now)
                    if isinstance(prepared, tuple):
                        batch.append(prepared)
                        order.append(str(prepared[0]["jid"]))
                    elif prepared is not None:
                        order.append(prepared)  # deferred: its jid, written later
                        deferred.add(prepared)
                batch = middleware.admit(batch, lambda: self.pool)
                if batch:
                    self._write_mixed(batch)
            except BaseException:
                middleware.unwritten((p for p, _ in batch), self.pool)
                raise
            kept = deferred | {str(p["jid"]) for p, _ in batch}
            jids.extend(jid for jid in order if jid in kept)
        return jids

    # -- building payloads ----------------------------------------------
    def normalise(self, item: Mapping[str, Any],
                   now: float) -> tuple[dict[str, Any], float | None]:
        cls = item.get("class")
        if not isinstance(cls, str) or not cls:
            raise TypeError(f"job 'class' must be a non-empty string, got {cls!r}")
        args = item.get("args", [])
        if not isinstance(args, list):
            raise TypeError(f"job 'args' must be a list, got {type(args).__name__}")
        check_args(args)
        queue = item.get("queue", "default")
        if not isinstance(queue, str) or not queue:
            raise TypeError(f"job 'queue' must be a non-empty string, got {queue!r}")
        payload: dict[str, Any] = {"retry": True, "queue": queue}
        payload.update((k, v) for k, v in item.items() if k != "at")
        payload.setdefault("jid", new_jid())
        payload.setdefault("created_at", now_stamp(self.config.timestamps, now))
        run_at = self._run_at(item.get("at"), now)
        stamp_expiry(payload, run_at, now)
        if run_at is None:
            payload["enqueued_at"] = now_stamp(self.config.timestamps, now)
        else:
            payload.pop("enqueued_at", None)
        return payload, run_at

    def _through_middleware(self, prepared: tuple[dict[str, Any], float | None],
                            now: float) -> tuple[dict[str, Any], float | None] | str | None:
        """Run the client middleware (if any) on a normalised payload: None when
        one stopped the push, the jid when one deferred it (``middleware.defer``),
        else the payload checked again as a push would be."""
        chain = self.config.client_middleware if self._middleware is None else self._middleware
        if not chain:
            return prepared
        payload, run_at = prepared
        if run_at is not None:
            payload["at"] = run_at  # as Sidekiq's middleware sees a scheduled job
        outcome = middleware.run(chain, payload, self.pool, lambda: self.push(payload))
        if outcome != "write":
            return str(payload["jid"]) if outcome == "defer" else None
        # A middleware may have changed anything, ``at`` and ``args`` included.
        return self.normalise(payload, now)

    @staticmethod
    def _run_at(at: Any, now: float) -> float | None:
        if at is None:
            return None
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise TypeError(f"job 'at' must be epoch seconds, got {at!r}")
        # As Sidekiq's raw push: ``at`` is an epoch time; one already past runs now.
        return float(at) if at > now else None

    # -- writing ----------------------------------------------------------
    def _write(self, payloads: Sequence[dict[str, Any]], run_at: float | None) -> None:
        self._write_mixed([(p, run_at) for p in payloads])

    def _write_mixed(self, batch: Sequence[tuple[dict[str, Any], float | None]]) -> None:
        if self.confirmed is not None:
            self._write_confirmed(self.confirmed, batch)
            return
        content = _as_push(batch)
        immediate: dict[str, list[str]] = {}
        scheduled: list[str] = []
        for job in content.jobs:
            if job.run_at is None:
                immediate.setdefault(job.queue, []).append(job.raw)
            else:
                scheduled.extend((score(job.run_at), job.raw))
        commands: list[tuple[Any, ...]] = []
        if immediate:
            commands.append(("SADD", keys.QUEUES, *immediate))
            commands.extend(("LPUSH", keys.queue(q), *jobs) for q, jobs in immediate.items())
        if scheduled:
            commands.append(("ZADD", keys.SCHEDULE, *scheduled))
        # Only a ZADD of exact members is safe to send twice.
        idempotent = not immediate
        if self.buffer is None:
            self.pool.pipeline(commands, idempotent=idempotent)
        else:
            self.buffer.send(PendingPush(
                lambda attempts: self.pool.pipeline(commands, idempotent=idempotent,
                                                    attempts=attempts), content.jids,
                content=content))

    def _write_confirmed(self, writer: ConfirmedWriter,
                         batch: Sequence[tuple[dict[str, Any], float | None]]) -> None:
        push = _as_push(batch)
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


def _bulk_item(item: Mapping[str, Any], args: list[Any], at: Any, created: Any) -> dict[str, Any]:
    one = {k: v for k, v in item.items() if k not in ("args", "at", "jid")}
    one["args"] = args
    if at is not None:
        one["at"] = at
    one.setdefault("created_at", created)
    return one


def _as_push(batch: Sequence[tuple[dict[str, Any], float | None]]) -> ConfirmedPush:
    return ConfirmedPush(tuple(QueuedJob(str(p["jid"]), p["queue"], dumps(p), run_at)
                               for p, run_at in batch))


def forget_default_client() -> None:
    """Drop the process's default client (a forked child, or a new default config)."""
    Client._default = None

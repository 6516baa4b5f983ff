"""Reliable fetch: a job leaves Redis only when its processor acknowledges it.

Duties:
1. One fetcher thread per process claims jobs for the processor threads that
   are waiting, moving them atomically (CLAIM script) from their queue to a
   private list owned by this process's identity; acknowledgements waiting to
   be sent ride along in the same round trip. When every queue is empty it
   blocks on BRPOPLPUSH instead of polling (at maxmemory, where Redis
   refuses that move but not the claim, it polls with claims). The owner
   registration at start is retried before a blocking move if it failed:
   a claim registers what it moves, a blocking move does not. Anything its
   loop raises is logged (``fetch.error``) and the loop goes on after a
   pause; the thread runs under :mod:`wurk.threads`.
2. ``acknowledge`` removes a finished job from the private list and retires
   its poison-pill counter (batched with the next claim, or sent at once by
   the processor when the fetcher is blocked). A failed job is not
   acknowledged: ``settle`` removes its copy and writes its retry or dead
   entry in one script (``wurk.settle``), so no acknowledgement can outlive
   a failure and delete a later copy of the job.
3. ``requeue`` gives unfinished jobs back to their queues (REQUEUE script),
   so a stop never loses one.
4. After any disruption of the pool (a claim whose reply was lost, a
   failover, a restarted Redis), ``resync`` gives back whatever sits in the
   private lists that this process does not know it holds. A promoted
   replica may lack an acknowledgement the old primary took; without this
   the job would wait in a live process's private list until it exits.

Recovering a dead process's lists is the reaper's job (wurk.reaper).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk import keys, settle, threads
from wurk.fetch import PausedQueues, UnitOfWork
from wurk.logging import get_logger
from wurk.lua import CLAIM, REQUEUE

if TYPE_CHECKING:
    from wurk.config import Config
    from wurk.queues import QueuePlan
    from wurk.settle import Settlement

log = get_logger("wurk.fetch")
ERROR_PAUSE = 1.0
# The longest a finished job waits for its acknowledgement to be sent.
ACK_DELAY = 0.05


class ReliableFetch:
    def __init__(self, config: Config, plan: QueuePlan, identity: str) -> None:
        self.config = config
        self.plan = plan
        self.identity = identity
        # One lock for the bookkeeping; the fetcher waits on _wake. Claimed
        # jobs travel to processors through a SimpleQueue, whose blocking get
        # is a C lock: far cheaper per job than a Python Condition.
        self._cond = threading.Lock()
        self._wake = threading.Condition(self._cond)
        self._ready: queue.SimpleQueue[UnitOfWork | None] = queue.SimpleQueue()
        self._acks: list[tuple[UnitOfWork, str | None]] = []
        self._acks_since = 0.0
        # Claim a few more than are waiting, so a busy pool pays one round
        # trip per several jobs; acks wait to ride along, briefly.
        self._batch = max(1, config.concurrency // 2)
        self._ack_batch = max(1, config.concurrency)
        # Claimed and not yet acknowledged or given back, by object identity
        # (cheap per job); resync, which is rare, compares payloads.
        self._held: dict[int, UnitOfWork] = {}
        self._waiting = 0
        self._blocking = False
        self._stopping = False
        self._quiet = False
        self._thread: threading.Thread | None = None
        self._resync_pending = False
        self._registered = True
        self._disruptions_seen = config.pool.disruptions
        self.paused = PausedQueues(config)
        single = len(plan.names) == 1
        # With one queue a blocking move waits on all our work; with several
        # it can only wait on one, so it wakes often enough to look at the rest.
        self._block_seconds = config.fetch_timeout if single else min(
            config.fetch_timeout, config.reliable_poll_interval)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        try:
            self._register()
        except Exception as exc:  # noqa: BLE001 - at maxmemory the claim still works
            # CLAIM registers what it moves; only a blocking move needs this first.
            log.warning("fetch.register_failed", error=f"{type(exc).__name__}: {exc}")
            self._registered = False
        self._thread = threads.start("fetcher", self._loop, stopped=lambda: self._stopping)

    def quiet(self) -> None:
        """Stop claiming; jobs claimed but not yet started go straight back."""
        with self._cond:
            self._quiet = True
            unstarted = self._take_ready()
            self._wake.notify_all()
        self._release_waiters()
        self._give_back(unstarted)

    def stop(self) -> None:
        """Stop the fetcher; hand back claimed-but-unstarted jobs and flush acks."""
        with self._cond:
            self._stopping = True
            self._wake.notify_all()
        self._release_waiters()
        if self._thread is not None:
            self._thread.join(self.config.pool.deadline.clip(
                self.config.fetch_timeout + self.config.redis_read_timeout + 1))
        with self._cond:
            unstarted = self._take_ready()
        self._flush_acks()
        self._give_back(unstarted)

    # -- the processor side ---------------------------------------------------
    def fetch(self) -> UnitOfWork | None:
        try:
            work = self._ready.get_nowait()
        except queue.Empty:
            work = self._wait_for_work()
        if work is not None and self._quiet:
            # Claimed before quiet but not started: it goes back, not run.
            self._give_back([work])
            return None
        return work

    def _wait_for_work(self) -> UnitOfWork | None:
        with self._cond:
            if self._stopping or self._quiet:
                return None
            self._waiting += 1
            self._wake.notify()
        try:
            return self._ready.get(timeout=self.config.fetch_timeout)
        except queue.Empty:
            return None
        finally:
            with self._cond:
                self._waiting -= 1

    def _release_waiters(self) -> None:
        """Wake processors blocked in fetch (quiet or stop): each gets None."""
        for _ in range(self._waiting):
            self._ready.put(None)

    def _take_ready(self) -> list[UnitOfWork]:
        """Empty the hand-over queue of claimed-but-unstarted jobs."""
        taken: list[UnitOfWork] = []
        while True:
            try:
                work = self._ready.get_nowait()
            except queue.Empty:
                return taken
            if work is not None:
                taken.append(work)

    def acknowledge(self, work: UnitOfWork, jid: str | None = None) -> None:
        with self._cond:
            if not self._acks:
                self._acks_since = time.monotonic()
            self._acks.append((work, jid))
            direct = self._blocking or self._stopping
            if len(self._acks) >= self._ack_batch:
                self._wake.notify()
        if direct:
            self._flush_acks()

    def settle(self, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
        """Remove this run's copy and write the failed job's entry, in one script."""
        settled = settle.write(self.config, settlement, keys.wip(self.identity, work.queue),
                               work.raw, keys.pill(jid) if jid else "")
        with self._cond:
            self._release(work)
        return settled

    def requeue(self, works: Iterable[UnitOfWork]) -> int:
        works = list(works)
        if not works:
            return 0
        args: list[Any] = []
        for work in works:
            args += [keys.wip(self.identity, work.queue), keys.queue(work.queue), work.raw]
        moved: int = self.config.pool.run(lambda c: REQUEUE.run(c, [], args), idempotent=True)
        with self._cond:
            for work in works:
                self._release(work)
        return moved

    # -- the fetcher thread --------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not (want := self._want()) \
                        and not self._acks_due():
                    self._wake.wait(ACK_DELAY if self._acks else None)
                if self._stopping:
                    return
                acks, self._acks = self._acks, []
            try:
                if self._needs_resync():
                    # No claim until a resync succeeds, or strays could sit
                    # in our private lists for ever.
                    self.resync()
                    self._resync_pending = False
                claimed = self._claim(want, acks)
                if want and not claimed:
                    self._block()
            except BaseException as exc:  # noqa: BLE001 - keep fetching through any trouble
                self._recover_from(exc, acks)

    def _needs_resync(self) -> bool:
        seen = self.config.pool.disruptions
        if seen != self._disruptions_seen:
            self._disruptions_seen = seen
            self._resync_pending = True
        return self._resync_pending

    def _want(self) -> int:
        """Jobs to claim now (caller holds the lock): none unless a processor waits."""
        shortfall = self._waiting - self._ready.qsize()
        if self._quiet or shortfall <= 0:
            return 0
        return max(shortfall, self._batch)

    def _acks_due(self) -> bool:
        """Caller holds the lock."""
        return bool(self._acks) and (len(self._acks) >= self._ack_batch
                                     or time.monotonic() - self._acks_since >= ACK_DELAY)

    def _claim(self, want: int, acks: list[tuple[UnitOfWork, str | None]]) -> int:
        names = self.plan.order()
        keys_: list[str] = [keys.PAUSED, keys.WIP_OWNERS, keys.wip_queues(self.identity)]
        for name in names:
            keys_ += [keys.queue(name), keys.wip(self.identity, name)]
        args: list[Any] = [self.identity, want, len(names), *names]
        for work, jid in acks:
            args += [keys.wip(self.identity, work.queue), work.raw, keys.pill(jid) if jid else ""]
        reply = self.config.pool.run(lambda c: CLAIM.run(c, keys_, args))
        with self._cond:
            for work, _ in acks:
                self._release(work)
            for i in range(0, len(reply), 2):
                self._hand_over(UnitOfWork(reply[i].decode(), reply[i + 1]))
        self._give_back_if_quiet()
        return len(reply) // 2

    def _register(self) -> None:
        """Own our private lists before a blocking move can fill one (which
        registers nothing itself), so recovery always finds them."""
        self.config.pool.pipeline(
            [("SADD", keys.WIP_OWNERS, self.identity),
             ("SADD", keys.wip_queues(self.identity), *self.plan.names)], idempotent=True)
        self._registered = True

    def _block(self) -> None:
        """Wait for work on the first unpaused queue (or just wait, if all are paused)."""
        paused = self.paused.current()
        name = next((q for q in self.plan.order() if q not in paused), None)
        if name is None:
            with self._cond:
                self._wake.wait(self._block_seconds)
            return
        with self._cond:
            self._blocking = True
        try:
            if not self._registered:
                self._register()
            raw = self.config.pool.run(lambda c: c.call(
                "BRPOPLPUSH", keys.queue(name), keys.wip(self.identity, name),
                _block_arg(self._block_seconds),
                timeout=self._block_seconds + self.config.redis_read_timeout))
        except rx.OutOfMemoryError:
            # At maxmemory Redis refuses a blocking move (and the registration
            # before it), while a claim, which frees first, still works: wait
            # as the block would have, then claim again.
            raw = None
            with self._cond:
                self._wake.wait(self._block_seconds)
        finally:
            with self._cond:
                self._blocking = False
        if raw is not None:
            with self._cond:
                self._hand_over(UnitOfWork(name, raw))
            self._give_back_if_quiet()

    def _give_back_if_quiet(self) -> None:
        """Jobs that landed after quiet (a claim or block already under way) go straight back."""
        with self._cond:
            if not self._quiet:
                return
            unstarted = self._take_ready()
        self._give_back(unstarted)

    def _give_back(self, unstarted: list[UnitOfWork]) -> None:
        """Requeue claimed-but-unstarted jobs. If Redis is away they stay in the
        private list, for the release at stop or, failing that, the reaper."""
        if not unstarted:
            return
        try:
            self.requeue(unstarted)
        except Exception as exc:  # noqa: BLE001 - quiet and stop must not fail on Redis
            log.error("fetch.requeue_failed", jobs=len(unstarted),
                      error=f"{type(exc).__name__}: {exc}")

    def _hand_over(self, work: UnitOfWork) -> None:
        """Caller holds the lock."""
        self._held[id(work)] = work
        self._ready.put(work)

    def _release(self, work: UnitOfWork) -> None:
        """Caller holds the lock."""
        self._held.pop(id(work), None)

    def _flush_acks(self) -> None:
        with self._cond:
            acks, self._acks = self._acks, []
        if not acks:
            return
        args: list[Any] = [self.identity, 0, 0]
        for work, jid in acks:
            args += [keys.wip(self.identity, work.queue), work.raw, keys.pill(jid) if jid else ""]
        try:
            # Removing a finished job twice removes nothing more: safe to replay.
            self.config.pool.run(lambda c: CLAIM.run(c, [keys.PAUSED, keys.WIP_OWNERS,
                                                         keys.wip_queues(self.identity)], args),
                                 idempotent=True)
        except Exception as exc:  # noqa: BLE001
            log.error("fetch.ack_failed", jobs=len(acks), error=f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._acks = acks + self._acks
            return
        with self._cond:
            for work, _ in acks:
                self._release(work)

    def _recover_from(self, exc: BaseException, acks: list[tuple[UnitOfWork, str | None]]) -> None:
        log.error("fetch.error", error=f"{type(exc).__name__}: {exc}")
        with self._cond:
            # Acks are safe to send again; claims that may have landed are
            # found by the resync the loop runs before its next claim.
            self._acks = acks + self._acks
        time.sleep(ERROR_PAUSE)

    def resync(self) -> int:
        """Give back private-list entries this process does not know it holds."""
        lists = [keys.wip(self.identity, name) for name in self.plan.names]
        contents = self.config.pool.pipeline([("LRANGE", k, 0, -1) for k in lists],
                                             idempotent=True)
        with self._cond:
            known = collections.Counter((w.queue, w.raw) for w in self._held.values())
        strays: list[UnitOfWork] = []
        for name, entries in zip(self.plan.names, contents, strict=True):
            for raw in entries:
                if known[(name, raw)] > 0:
                    known[(name, raw)] -= 1
                else:
                    strays.append(UnitOfWork(name, raw))
        if strays:
            args: list[Any] = []
            for work in strays:
                args += [keys.wip(self.identity, work.queue), keys.queue(work.queue), work.raw]
            self.config.pool.run(lambda c: REQUEUE.run(c, [], args), idempotent=True)
            log.warning("fetch.resynced", jobs=len(strays))
        return len(strays)


def _block_arg(seconds: float) -> int | float:
    return int(seconds) if float(seconds).is_integer() else seconds

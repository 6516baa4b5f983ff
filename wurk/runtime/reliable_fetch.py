"""Reliable fetch: a job leaves Redis only when its processor acknowledges it.

Duties (docs/explanation/internals.md walks through them step by step; the
round trips themselves are wurk.runtime.private_lists):
1. One fetcher thread claims a job for each processor thread waiting with none on its
   way, all in one round trip (CLAIM moves them from their queue to this process's
   private list; pending acks ride along). A process never holds more jobs than
   threads. With every queue empty it blocks on BRPOPLPUSH; the job that lands waits
   for the next CLAIM to check it (at maxmemory, where Redis refuses the move, it
   polls with claims). Anything the loop raises is logged (``fetch.error``) and the
   loop goes on after a pause, under :mod:`wurk.core.threads`.
2. Suspects (jobs recovered from a dead process, wurk.runtime.reaper) run alone: CLAIM
   hands one only to a process that holds nothing else; while one runs or waits, we claim none.
3. ``acknowledge`` removes a finished job from the private list and retires
   its poison-pill counter and suspect mark, batched with the next claim or
   sent at once while the fetcher blocks, and never held past ACK_DELAY
   (once quiet there is no next claim: the first ack starts that timer).
   A failed job is never acknowledged: ``settle`` removes its copy and
   writes its retry or dead entry in one script (``wurk.runtime.settle``).
4. ``requeue`` gives unfinished jobs back to their queues (REQUEUE script).
5. After a disruption of the pool (a lost claim reply, a failover, a restarted Redis),
   ``resync`` gives back what sits in our private lists that we do not know we hold.
6. A claimed job carries the data epoch known before its claim (wurk.runtime.epoch);
   after a data loss we register as owner again before the next blocking move.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import redis.exceptions as rx

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.redis.runtime import Runtime, handed
from wurk.runtime import private_lists, settle
from wurk.runtime.epoch import Epoch
from wurk.runtime.fetch import PausedQueues
from wurk.runtime.handover import HandOver
from wurk.runtime.private_lists import SUSPECT_WAITS, Ack
from wurk.runtime.work import Sender, UnitOfWork
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.runtime.work import Settlement
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.fetch")
ERROR_PAUSE = 1.0
# The longest a finished job waits for its acknowledgement to be sent.
ACK_DELAY = 0.05


class ReliableFetch:
    def __init__(self, config: Config, plan: QueuePlan, identity: str,
                 *, runtime: Runtime | None = None) -> None:
        self.config, self.runtime = config, handed(runtime, config)
        self.plan = plan
        self.identity = identity
        # One lock for the bookkeeping; the fetcher waits on _wake. Claimed
        # jobs travel to processors through the hand-over, which shares the lock.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._handover = HandOver(self._lock, self._wake, config.fetch_timeout,
                                  closed=lambda: self._stopping or self._quiet)
        # Acks wait to ride along with the next claim, briefly.
        self._acks: list[Ack] = []
        self._acks_since = 0.0
        self._ack_batch = max(1, config.concurrency)
        # Claimed and not yet acknowledged or given back, by object identity
        # (cheap per job); resync, which is rare, compares payloads.
        self._held: dict[int, UnitOfWork] = {}
        # Ack flushes sent by processor threads, still under way.
        self._flushing = 0
        self._suspect: UnitOfWork | None = None
        self._suspect_waits = False
        # Moved by BRPOPLPUSH, held back until a CLAIM has checked it.
        self._landed: UnitOfWork | None = None
        self._blocking = False
        self._move = private_lists.BlockingMove(self.runtime, identity)
        self._stopping = False
        self._quiet = False
        self._thread: threading.Thread | None = None
        self._registered = True
        self.epoch = Epoch(config, runtime=self.runtime)
        self.epoch.on_lost(lambda: setattr(self, "_registered", False))
        self._resync_pending = False
        self._disruptions_seen = self.runtime.pool.disruptions
        self.paused = PausedQueues(config, runtime=self.runtime)
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
        with self._lock:
            self._quiet = True
            unstarted = self._handover.take_all()
            self._wake.notify_all()
            self._handover.release_waiters()
        self._give_back(unstarted)

    def stop(self) -> None:
        """Stop the fetcher; hand back claimed-but-unstarted jobs and flush acks."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            self._handover.release_waiters()
        if self._thread is not None:
            self._move.end(self._thread, self.runtime.pool.deadline.clip(
                self.config.fetch_timeout + self.config.redis_read_timeout + 1) or 0.0)
        with self._lock:
            unstarted = self._handover.take_all() + ([self._landed] if self._landed else [])
            self._landed = None
        self._flush_acks()
        with self._lock:  # an ack in flight must land before the lists are released
            self._wake.wait_for(lambda: not self._flushing,
                                self.runtime.pool.deadline.clip(self.config.redis_read_timeout + 1))
        self._give_back(unstarted)

    # -- the processor side ---------------------------------------------------
    def fetch(self) -> UnitOfWork | None:
        work = self._handover.take()
        if work is not None and self._quiet:
            # Claimed before quiet but not started: it goes back, not run.
            self._give_back([work])
            return None
        return work

    def fetch_many(self, most: int) -> list[UnitOfWork]:
        """Up to ``most`` jobs for the asyncio executor's feeder: one claim for
        all of them (see :meth:`HandOver.take_many`)."""
        works = self._handover.take_many(most)
        if works and self._quiet:
            self._give_back(works)  # claimed before quiet but not started
            return []
        return works

    def acknowledge(self, work: UnitOfWork, jid: str | None = None,
                    send: Sender | None = None) -> None:
        """Queue the ack for the next claim. While the fetcher blocks or
        stops there is no next claim soon: the acks are sent at once, on
        this thread, or through ``send`` (a caller that must not wait on
        Redis, the event loop, passes its bookkeeping pool's submit)."""
        with self._lock:
            first = not self._acks
            if first:
                self._acks_since = time.monotonic()
            self._acks.append((work, jid))
            direct = self._blocking or self._stopping
            # A suspect's end frees the next claim: no waiting out ACK_DELAY.
            # Once quiet no thread asks for work, so the fetcher may be waiting
            # with no timeout: the first ack sets it on its ACK_DELAY wait.
            if len(self._acks) >= self._ack_batch or self._suspect is not None \
                    or (first and self._quiet):
                self._wake.notify()
        if direct:
            if send is None:
                self._flush_acks()
            else:
                send(self._flush_acks)

    def settle(self, work: UnitOfWork, jid: str | None, settlement: Settlement) -> bool:
        """Remove this run's copy and write the failed job's entry, in one script."""
        settled = settle.write(self.runtime, settlement, keys.wip(self.identity, work.queue),
                               work.raw, keys.pill_arg(jid), epoch=work.epoch)
        with self._lock:
            self._release(work)
            self._wake.notify()
        return settled

    def requeue(self, works: Iterable[UnitOfWork]) -> int:
        works = list(works)
        if not works:
            return 0
        moved = private_lists.give_back(self.runtime, self.identity, works)
        with self._lock:
            for work in works:
                self._release(work)
            self._wake.notify()
        return moved

    # -- the fetcher thread --------------------------------------------------
    def _loop(self) -> None:
        while (due := self._next_round()) is not None:
            want, acks = due
            try:
                self._round(want, acks)
            except BaseException as exc:  # noqa: BLE001 - keep fetching through any trouble
                self._recover_from(exc, acks)

    def _next_round(self) -> tuple[int, list[Ack]] | None:
        """Wait until there is a claim, a landed job or acks to send; None once stopping."""
        with self._lock:
            while not self._stopping and self._landed is None and not self._want() \
                    and not self._acks_due():
                self._wake.wait(ACK_DELAY if self._acks else None)
        # Yield the GIL until no more threads come to wait (a pass per thread
        # at most): threads just finishing a job get to queue their ack and
        # wait, so one round trip serves them all.
        want = -1
        while True:
            time.sleep(0)
            with self._lock:
                if self._stopping:
                    return None
                more = self._want()
                if more <= want:
                    acks, self._acks = self._acks, []
                    return more, acks
            want = more

    def _round(self, want: int, acks: list[Ack]) -> None:
        if self._needs_resync():
            # No claim until a resync succeeds, or strays could sit
            # in our private lists for ever.
            self.resync()
            self._resync_pending = False
        looked = want > 0 or self._landed is not None
        claimed = self._claim(want, acks, self._landed)
        if looked and self._suspect_waits and not self._held:
            # CLAIM saw jobs in our lists that we do not know we hold: give
            # them back before looking again, and never spin meanwhile.
            self._resync_pending = True
            self._pause(self.config.reliable_poll_interval)
        elif want and not claimed and not self._suspect_waits:
            self._landed = self._block()

    def _needs_resync(self) -> bool:
        seen = self.runtime.pool.disruptions
        if seen != self._disruptions_seen:
            self._disruptions_seen = seen
            self._resync_pending = True
        return self._resync_pending

    def _want(self) -> int:
        """Jobs to claim now (caller holds the lock): one per waiting thread
        with none on its way; none while a suspect runs or waits for us to
        hold nothing, or while a processor's ack flush is under way."""
        shortfall = self._handover.shortfall()
        if self._quiet or shortfall <= 0 or self._flushing:
            return 0
        if (self._suspect is not None or self._suspect_waits) and not self._idle():
            return 0
        return shortfall

    def _idle(self) -> bool:
        """Every job we hold has finished, its ack waiting to go (caller holds the lock)."""
        acked = {id(work) for work, _ in self._acks}
        return all(key in acked for key in self._held)

    def _acks_due(self) -> bool:
        """Caller holds the lock."""
        return bool(self._acks) and (len(self._acks) >= self._ack_batch
                                     or time.monotonic() - self._acks_since >= ACK_DELAY)

    def _claim(self, want: int, acks: list[Ack], landed: UnitOfWork | None = None) -> int:
        epoch = landed.epoch if landed else self.epoch.current  # a landed copy may predate a loss
        claimed = private_lists.claim(self.runtime, self.identity, self.plan.order(), want,
                                      landed=landed, acks=acks, epoch=epoch)
        with self._lock:
            for work, _ in acks:
                self._release(work)
            if landed is not None:
                self._release(landed)  # the reply holds it again if it is ours to run
                self._landed = None
            for work in claimed.works:
                self._hand_over(work)
            self._suspect = claimed.suspect or self._suspect
            if want > 0 or landed is not None:  # the script looked at the queues
                self._suspect_waits = claimed.status == SUSPECT_WAITS
        self._give_back_if_quiet()
        return len(claimed.works)

    def _block(self) -> UnitOfWork | None:
        """Wait for work on the first unpaused queue (or just wait, if all are paused).

        Returns the job that landed in our private list, not yet handed over.
        """
        paused = self.paused.current()
        name = next((q for q in self.plan.order() if q not in paused), None)
        if name is None:
            self._pause(self._block_seconds)
            return None
        with self._lock:
            self._blocking = True
        epoch = self.epoch.current
        try:
            # Acks that came in since the claim would otherwise wait out the block.
            self._flush_acks()
            if not self._registered:
                self._register()
            raw = self._move.wait(name, self._block_seconds)
        except rx.OutOfMemoryError:
            # At maxmemory Redis refuses a blocking move (and the registration
            # before it), while a claim, which frees first, still works: wait
            # as the block would have, then claim again.
            raw = None
            self._pause(self._block_seconds)
        finally:
            with self._lock:
                self._blocking = False
        if raw is None:
            return None
        work = UnitOfWork(name, raw, epoch)
        with self._lock:
            self._held[id(work)] = work
        return work

    def _register(self) -> None:
        private_lists.register_owner(self.runtime, self.identity, self.plan.names)
        self._registered = True

    def _pause(self, seconds: float) -> None:
        with self._lock:
            if not self._stopping:
                self._wake.wait(seconds)

    def _give_back_if_quiet(self) -> None:
        """Jobs that landed after quiet (a claim or block already under way) go straight back."""
        with self._lock:
            if not self._quiet:
                return
            unstarted = self._handover.take_all()
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
        self._handover.put(work)

    def _release(self, work: UnitOfWork) -> None:
        """Caller holds the lock."""
        self._held.pop(id(work), None)
        if work is self._suspect:
            self._suspect = None

    def _flush_acks(self) -> None:
        with self._lock:
            acks, self._acks = self._acks, []
            if not acks:
                return
            self._flushing += 1
        sent = False
        try:
            private_lists.settle(self.runtime, self.identity, acks)
            sent = True
        except Exception as exc:  # noqa: BLE001
            log.error("fetch.ack_failed", jobs=len(acks), error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                if sent:
                    for work, _ in acks:
                        self._release(work)
                else:
                    self._acks = acks + self._acks
                self._flushing -= 1
                self._wake.notify()

    def _recover_from(self, exc: BaseException, acks: list[Ack]) -> None:
        log.error("fetch.error", error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            # Acks are safe to send again; claims that may have landed are
            # found by the resync the loop runs before its next claim.
            self._acks = acks + self._acks
        time.sleep(ERROR_PAUSE)

    def resync(self) -> int:
        """Give back private-list entries this process does not know it holds."""
        with self._lock:
            held = list(self._held.values())
        return private_lists.resync(self.runtime, self.identity, self.plan.names, held)


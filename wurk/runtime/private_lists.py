"""The Redis side of reliable fetch: round trips on a process's private lists.

Duties:
1. ``claim``: one CLAIM round trip (settle acks, check a job BRPOPLPUSH
   landed, claim for the waiting threads) and what its reply says: the jobs
   handed to us, and whether a suspect is among them or waits for us.
2. ``settle``: send acknowledgements alone (the same script, claiming nothing).
3. ``wait_and_move``: block until a queue has a job and move it (BRPOPLPUSH);
   :class:`BlockingMove` keeps the waiting connection's client id so a stop
   ends the wait at once (CLIENT UNBLOCK: it moves nothing, as a timeout).
4. ``give_back``: REQUEUE jobs from a private list to the fetch end of their queue.
5. ``strays``: the entries of the private lists a process does not know it
   holds; ``resync`` gives them back.

The threads, and the bookkeeping of who holds what, are wurk.runtime.reliable_fetch's.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.runtime.work import UnitOfWork
from wurk.wire import keys
from wurk.wire.lua import CLAIM, REQUEUE

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.redis.runtime import Runtime

log = get_logger("wurk.fetch")
Ack = tuple[UnitOfWork, str | None]
# CLAIM's reply status besides 0.
SUSPECT_CLAIMED = 1  # the one job claimed is a suspect: it runs alone
SUSPECT_WAITS = 2  # a suspect waits at a queue head for this process to hold nothing


@dataclass(frozen=True)
class Claimed:
    status: int
    works: list[UnitOfWork]

    @property
    def suspect(self) -> UnitOfWork | None:
        return self.works[0] if self.status == SUSPECT_CLAIMED else None


def claim(runtime: Runtime, identity: str, names: Sequence[str], want: int, *,
          landed: UnitOfWork | None, acks: list[Ack], epoch: str = "") -> Claimed:
    """Not idempotent: a lost reply may leave jobs claimed, for a resync to find.
    The jobs carry ``epoch``, the data epoch known before the claim was sent."""
    keys_ = _fixed_keys(identity)
    for name in names:
        keys_ += [keys.queue(name), keys.wip(identity, name)]
    args: list[Any] = [identity, want, len(names), *names,
                       names.index(landed.queue) + 1 if landed else 0,
                       landed.raw if landed else b"", *_ack_args(identity, acks)]
    reply = runtime.pool.run(lambda c: CLAIM.run(c, keys_, args))
    return Claimed(int(reply[0]), [UnitOfWork(reply[i].decode(), reply[i + 1], epoch)
                                   for i in range(1, len(reply), 2)])


def settle(runtime: Runtime, identity: str, acks: list[Ack]) -> None:
    args: list[Any] = [identity, 0, 0, 0, b"", *_ack_args(identity, acks)]
    # Removing a finished job twice removes nothing more: safe to replay.
    runtime.pool.run(lambda c: CLAIM.run(c, _fixed_keys(identity), args), idempotent=True)


def wait_and_move(runtime: Runtime, identity: str, name: str, seconds: float,
                  blocked: Callable[[int | None], None]) -> bytes | None:
    """Not idempotent either: a job moved whose reply was lost waits for a resync.

    ``blocked`` hears the Redis client id of the connection about to block (None
    if Redis will not say), so a stop can end the wait at once (:func:`unblock`).
    """
    # Sidekiq sends an integer; Redis 6+ also takes a decimal.
    block: int | float = int(seconds) if float(seconds).is_integer() else seconds

    def move(conn: Conn) -> bytes | None:
        try:
            blocked(int(conn.call("CLIENT", "ID")))
        except rx.ResponseError:  # an ACL without CLIENT: the stop waits the block out
            blocked(None)
        moved: bytes | None = conn.call("BRPOPLPUSH", keys.queue(name), keys.wip(identity, name),
                                        block, timeout=seconds + runtime.config.redis_read_timeout)
        return moved

    return runtime.pool.run(move)


class BlockingMove:
    """The fetcher's wait on an empty queue, which a stop ends at once: the
    stop's time is for handing jobs back and the goodbye, not for a fetch
    that can only come back empty."""

    def __init__(self, runtime: Runtime, identity: str) -> None:
        self.runtime = runtime
        self.identity = identity
        self.client: int | None = None  # the waiting connection's Redis client id

    def wait(self, name: str, seconds: float) -> bytes | None:
        try:
            return wait_and_move(self.runtime, self.identity, name, seconds, self._blocked)
        finally:
            self.client = None

    def _blocked(self, client: int | None) -> None:
        self.client = client

    def end(self, thread: threading.Thread, wait: float) -> None:
        """Wait up to ``wait`` for the fetcher ``thread``, ending its move if it waits."""
        end = time.monotonic() + wait
        while thread.is_alive() and time.monotonic() < end:
            if self.client is not None:
                unblock(self.runtime, self.client)
            thread.join(min(0.05, max(0.0, end - time.monotonic())))


def unblock(runtime: Runtime, client_id: int) -> None:
    """End a blocking move as if it timed out (it moves nothing); a refusal is
    ignored: the move then ends by its own timeout."""
    try:
        runtime.pool.call("CLIENT", "UNBLOCK", client_id, idempotent=True)
    except Exception as exc:  # noqa: BLE001 - an ACL without CLIENT, Redis gone: wait it out
        log.debug("fetch.unblock_failed", error=describe(exc))


def give_back(runtime: Runtime, identity: str, works: Iterable[UnitOfWork]) -> int:
    """Only a job still in the private list goes back: never one twice."""
    args: list[Any] = []
    for work in works:
        args += [keys.wip(identity, work.queue), keys.queue(work.queue), work.raw]
    moved: int = runtime.pool.run(lambda c: REQUEUE.run(c, [], args), idempotent=True)
    return moved


def strays(runtime: Runtime, identity: str, names: Sequence[str],
           held: Iterable[UnitOfWork]) -> list[UnitOfWork]:
    """``held``: what the process knew it held just before the lists are read.
    Only its fetcher thread claims, and that thread is the one asking, so no
    job joins in between; one that leaves in between is simply not found."""
    known = collections.Counter((w.queue, w.raw) for w in held)
    contents: list[list[bytes]] = runtime.pool.pipeline(
        [("LRANGE", keys.wip(identity, name), 0, -1) for name in names], idempotent=True)
    found: list[UnitOfWork] = []
    for name, entries in zip(names, contents, strict=True):
        for raw in entries:
            if known[(name, raw)] > 0:
                known[(name, raw)] -= 1
            else:
                found.append(UnitOfWork(name, raw))
    return found


def resync(runtime: Runtime, identity: str, names: Sequence[str],
           held: Iterable[UnitOfWork]) -> int:
    """Give back what ``strays`` finds; returns how many went back."""
    found = strays(runtime, identity, names, held)
    if found:
        give_back(runtime, identity, found)
        log.warning("fetch.resynced", jobs=len(found))
    return len(found)


def _fixed_keys(identity: str) -> list[str]:
    return [keys.PAUSED, keys.WIP_OWNERS, keys.wip_queues(identity), keys.SUSPECTS]


def _ack_args(identity: str, acks: list[Ack]) -> list[Any]:
    args: list[Any] = []
    for work, jid in acks:
        args += [keys.wip(identity, work.queue), work.raw, keys.pill_arg(jid)]
    return args


def register_owner(runtime: Runtime, identity: str, queues: Sequence[str]) -> None:
    """Own our private lists before a blocking move can fill one, so that
    recovery always finds them (a claim registers what it moves)."""
    runtime.pool.pipeline(
        [("SADD", keys.WIP_OWNERS, identity), ("SADD", keys.wip_queues(identity), *queues)],
        idempotent=True)

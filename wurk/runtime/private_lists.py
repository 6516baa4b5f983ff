"""The Redis side of reliable fetch: round trips on a process's private lists.

Duties:
1. ``claim``: one CLAIM round trip (settle acks, check a job BRPOPLPUSH
   landed, claim for the waiting threads) and what its reply says: the jobs
   handed to us, and whether a suspect is among them or waits for us.
2. ``settle``: send acknowledgements alone (the same script, claiming nothing).
3. ``wait_and_move``: block until a queue has a job and move it (BRPOPLPUSH).
4. ``give_back``: REQUEUE jobs from a private list to the fetch end of their queue.
5. ``strays``: the entries of the private lists a process does not know it holds.

The threads, and the bookkeeping of who holds what, are wurk.runtime.reliable_fetch's.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.redis.pools import pool_for
from wurk.runtime.work import UnitOfWork
from wurk.wire import keys
from wurk.wire.lua import CLAIM, REQUEUE

if TYPE_CHECKING:
    from wurk.settings.config import Config

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


def claim(config: Config, identity: str, names: Sequence[str], want: int, *,
          landed: UnitOfWork | None, acks: list[Ack]) -> Claimed:
    """Not idempotent: a lost reply may leave jobs claimed, for a resync to find."""
    keys_ = _fixed_keys(identity)
    for name in names:
        keys_ += [keys.queue(name), keys.wip(identity, name)]
    args: list[Any] = [identity, want, len(names), *names,
                       names.index(landed.queue) + 1 if landed else 0,
                       landed.raw if landed else b"", *_ack_args(identity, acks)]
    reply = pool_for(config).run(lambda c: CLAIM.run(c, keys_, args))
    return Claimed(int(reply[0]), [UnitOfWork(reply[i].decode(), reply[i + 1])
                                   for i in range(1, len(reply), 2)])


def settle(config: Config, identity: str, acks: list[Ack]) -> None:
    args: list[Any] = [identity, 0, 0, 0, b"", *_ack_args(identity, acks)]
    # Removing a finished job twice removes nothing more: safe to replay.
    pool_for(config).run(lambda c: CLAIM.run(c, _fixed_keys(identity), args), idempotent=True)


def wait_and_move(config: Config, identity: str, name: str, seconds: float) -> bytes | None:
    """Not idempotent either: a job moved whose reply was lost waits for a resync."""
    # Sidekiq sends an integer; Redis 6+ also takes a decimal.
    block: int | float = int(seconds) if float(seconds).is_integer() else seconds
    raw: bytes | None = pool_for(config).run(lambda c: c.call(
        "BRPOPLPUSH", keys.queue(name), keys.wip(identity, name), block,
        timeout=seconds + config.redis_read_timeout))
    return raw


def give_back(config: Config, identity: str, works: Iterable[UnitOfWork]) -> int:
    """Only a job still in the private list goes back: never one twice."""
    args: list[Any] = []
    for work in works:
        args += [keys.wip(identity, work.queue), keys.queue(work.queue), work.raw]
    moved: int = pool_for(config).run(lambda c: REQUEUE.run(c, [], args), idempotent=True)
    return moved


def strays(config: Config, identity: str, names: Sequence[str],
           held: Iterable[UnitOfWork]) -> list[UnitOfWork]:
    """``held``: what the process knew it held just before the lists are read.
    Only its fetcher thread claims, and that thread is the one asking, so no
    job joins in between; one that leaves in between is simply not found."""
    known = collections.Counter((w.queue, w.raw) for w in held)
    contents: list[list[bytes]] = pool_for(config).pipeline(
        [("LRANGE", keys.wip(identity, name), 0, -1) for name in names], idempotent=True)
    found: list[UnitOfWork] = []
    for name, entries in zip(names, contents, strict=True):
        for raw in entries:
            if known[(name, raw)] > 0:
                known[(name, raw)] -= 1
            else:
                found.append(UnitOfWork(name, raw))
    return found


def _fixed_keys(identity: str) -> list[str]:
    return [keys.PAUSED, keys.WIP_OWNERS, keys.wip_queues(identity), keys.SUSPECTS]


def _ack_args(identity: str, acks: list[Ack]) -> list[Any]:
    args: list[Any] = []
    for work, jid in acks:
        args += [keys.wip(identity, work.queue), work.raw, keys.pill(jid) if jid else ""]
    return args


def register_owner(config: Config, identity: str, queues: Sequence[str]) -> None:
    """Own our private lists before a blocking move can fill one, so that
    recovery always finds them (a claim registers what it moves)."""
    pool_for(config).pipeline(
        [("SADD", keys.WIP_OWNERS, identity), ("SADD", keys.wip_queues(identity), *queues)],
        idempotent=True)

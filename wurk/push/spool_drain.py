"""Draining the push spool: jobs a process left on disk go into Redis, once each.

Duties:
1. ``drain_once``: for each spool file of this Redis, oldest first, claim it
   (see :func:`wurk.push.spool.claim`), check every line before pushing any,
   push its jobs in order through the PUSH_ONCE script with the nonces
   stored in the file, and delete it only once all are in. A crash
   mid-file leaves a claim that another drainer takes over; replaying the
   jobs already in is a no-op while their markers live (``keys.PUSHED_TTL``,
   renewed by every replay).
2. Move an unreadable file aside (``*.bad``) with one ERROR line naming it
   and its flaw; never push part of such a file.
3. Leave a file whose push failed (Redis down, refusing writes) for the next
   drain, logging why.
4. :class:`SpoolDrainer`: a service thread that drains at start and then every
   ``spool_interval`` seconds (``wurk run``, swarm children), or until the
   files it found at start are in (a ``Client``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wurk.core.logging import get_logger
from wurk.core.service import Service
from wurk.core.threads import describe
from wurk.push import spool
from wurk.push.confirmed import ConfirmedPush, ConfirmedWriter, QueuedJob
from wurk.redis.policy import trouble_backoff

if TYPE_CHECKING:
    from wurk.redis.pool import RedisPool
    from wurk.settings.config import Config

log = get_logger("wurk.spool")
# Jobs per script call: small enough for a quick call, large enough to be cheap.
BATCH = 100
# A client retries files it found at start this often while Redis is away:
# 2 s doubling to 30 s, jittered as any retry through Redis trouble.
CLIENT_RETRY = trouble_backoff(2.0, 30.0)
# Longest single wait: a lock's wait overflows on absurd timeouts, and an hour
# between looks is already longer than any useful spool_interval.
LONGEST_PAUSE = 3600.0


@dataclass
class DrainReport:
    pushed: list[tuple[str, list[str]]] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    other_target: list[str] = field(default_factory=list)


def drain_once(config: Config, pool: RedisPool, *, any_target: bool = False) -> DrainReport:
    """Push every spool file of this Redis that no live process holds."""
    report = DrainReport()
    target = spool.target_of(config)
    writer = ConfirmedWriter(config.replicas_to_confirm, config.push_replicas_timeout,
                             config.redis_read_timeout, retire=False)
    for name in spool.spool_files(spool.spool_dir(config)):
        if name.bad:
            continue
        if not any_target and _written_for(name) not in (target, None):
            # Seen without claiming it: no renames for a file left alone.
            report.other_target.append(f"{name.base}.spool")
            continue
        held = spool.claim(name)
        if held is None:
            report.busy.append(name.path.name)
            continue
        _drain_file(held, target, pool, writer, report, any_target=any_target)
    return report


def _written_for(name: spool.SpoolName) -> str | None:
    """The Redis a file names in its header; None if it cannot be read (the
    claim then checks it properly, and moves a bad one aside)."""
    try:
        with name.path.open("rb") as fh:
            return spool.read_header(fh).target
    except (OSError, spool.SpoolFormatError):
        return None


def _drain_file(held: spool.Claim, target: str, pool: RedisPool, writer: ConfirmedWriter,
                report: DrainReport, *, any_target: bool) -> None:
    try:
        header, jids = _check(held)
    except spool.SpoolFormatError as exc:
        _set_aside(held, str(exc), report)
        return
    if header.target != target and not any_target:
        report.other_target.append(held.name)
        held.release()
        return
    try:
        _push_all(held, header, pool, writer)
    except spool.SpoolFormatError as exc:  # changed since it was checked
        _set_aside(held, str(exc), report)
        return
    except Exception as exc:  # noqa: BLE001 - the file waits for the next drain
        held.release()
        report.failed.append((held.name, f"{type(exc).__name__}: {exc}"))
        log.error("spool.push_failed", path=str(held.path), jobs=header.jobs,
                  error=f"{type(exc).__name__}: {exc}", hint="it is tried again later")
        return
    held.finish()
    report.pushed.append((held.name, jids))
    log.warning("spool.pushed", path=str(held.path), jobs=len(jids), written_by=header.pid)


def _check(held: spool.Claim) -> tuple[spool.SpoolHeader, list[str]]:
    with held.reader() as fh:
        header = spool.read_header(fh)
        return header, [entry.jid for entry in spool.read_entries(fh, header)]


def _set_aside(held: spool.Claim, reason: str, report: DrainReport) -> None:
    try:
        where = str(held.move_aside())
    except OSError as exc:
        held.release()
        where = f"{held.path} (could not be moved: {exc.strerror})"
    report.bad.append((where, reason))
    log.error("spool.bad", path=where, error=reason,
              hint="moved aside, nothing pushed from it; see `wurk spool list`")


def _push_all(held: spool.Claim, header: spool.SpoolHeader, pool: RedisPool,
              writer: ConfirmedWriter) -> None:
    with held.reader() as fh:
        if spool.read_header(fh) != header:
            raise spool.SpoolFormatError("line 1: changed while it was being pushed")
        for push in _pushes(spool.read_entries(fh, header)):
            writer.write(pool, push)


def _pushes(entries: Iterator[spool.SpoolEntry]) -> Iterator[ConfirmedPush]:
    """Consecutive jobs of one push (same nonce) go together, BATCH at most."""
    batch: list[spool.SpoolEntry] = []
    for entry in entries:
        if batch and (entry.nonce != batch[0].nonce or len(batch) >= BATCH):
            yield _as_push(batch)
            batch = []
        batch.append(entry)
    if batch:
        yield _as_push(batch)


def _as_push(batch: list[spool.SpoolEntry]) -> ConfirmedPush:
    jobs = tuple(QueuedJob(e.jid, e.queue, e.job, e.at) for e in batch)
    return ConfirmedPush(jobs, nonce=batch[0].nonce)


class SpoolDrainer:
    """Drains the spool in a daemon thread: periodically, or (``until_empty``)
    only until the files of this Redis are in."""

    def __init__(self, config: Config, pool: RedisPool, *, until_empty: bool = False) -> None:
        self.config = config
        self.pool = pool
        self.until_empty = until_empty
        self._backoff = CLIENT_RETRY
        self.service = Service("spool-drainer", self._pass, failed=self._failed)
        # Drains completed, for tests and health views.
        self.passes = 0

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()

    def _pass(self) -> float:
        return self._passed(drain_once(self.config, self.pool))

    def _failed(self, exc: BaseException, failures: int) -> float:
        # An unreadable directory: a worker says so each interval, a client
        # once (it would not get better by asking again).
        log.error("spool.drain_failed", path=str(spool.spool_dir(self.config)),
                  error=describe(exc))
        return self._passed(DrainReport())

    def _passed(self, report: DrainReport) -> float:
        """Count a pass; the pause before the next (a client's drainer ends once
        nothing it found failed, and backs off while something did)."""
        self.passes += 1
        if not self.until_empty:
            return min(self.config.spool_interval, LONGEST_PAUSE)
        if not report.failed:
            self.service.stop()
        self._backoff = self._backoff.increment()
        return min(self._backoff.pause(), LONGEST_PAUSE)


_started: set[tuple[int, str, str]] = set()
_started_lock = threading.Lock()


def drain_at_start(config: Config, pool: RedisPool) -> None:
    """Once per process and spool: push what earlier processes left, in the background."""
    key = (os.getpid(), str(spool.spool_dir(config)), spool.target_of(config))
    with _started_lock:
        if key in _started:
            return
        _started.add(key)
    SpoolDrainer(config, pool, until_empty=True).start()


def forget_after_fork() -> None:
    """In a forked child: a fresh lock (another thread may have held it at fork)."""
    global _started_lock  # noqa: PLW0603 - a lock another thread held at fork is unusable
    _started_lock = threading.Lock()


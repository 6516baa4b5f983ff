"""The reaper: gives the private lists of dead processes back to their queues.

Duties:
1. ``recover(runtime, identity, cause)``: in one script, push every job in a
   dead (or stopping) process's private lists back to its queue (oldest
   nearest the fetch end). What else happens depends on the :class:`Cause`,
   because blame needs evidence:

   - ``RELEASED``: a live process gives back what its stop left behind.
   - ``NO_EVIDENCE``: the process died of something its jobs need not have
     done (a SIGKILL from an operator, a deploy or the OOM killer, a host
     restart, a heartbeat that lapsed, our own hard-timeout recycle). Its
     jobs go back unblamed and unsuspected, and run again at once,
     concurrently (at-least-once).
   - ``crashed(detail)``: the swarm parent saw the child die of something
     a job does to its own process (SIGSEGV, SIGABRT, an exit status that
     is none of ours, a memory recycle). Every job it held becomes a
     suspect, which reliable fetch runs alone until one of its runs
     finishes; a job that was the one job its crashed process held is
     blamed: a poison-pill counter per jid, and past ``max_recoveries`` it
     goes to the dead set with ``error_class`` :data:`POISON_CLASS` and a
     message saying how it crashed. Jobs that crashed in company are not
     counted, so they never share a crasher's count.
2. ``accuse(runtime, identity, detail)``: the same evidence against a live
   process's running jobs, which the swarm parent has just asked to drain
   for exceeding ``max_memory_mb``: each becomes a suspect, a lone one is
   blamed (and past ``max_recoveries`` leaves its private list for dead).
3. A periodic sweep (at boot, then every ``reaper_interval`` seconds, under a
   cluster-wide lock so processes do not dogpile): every registered owner
   whose heartbeat hash has expired is recovered, without evidence. A sweep
   that raises anything is logged and tried again an interval later; the
   thread is a :class:`wurk.core.service.Service`.
4. Each sweep first re-reads Redis's data epoch (``wurk.runtime.epoch``):
   after a data loss every heartbeat is gone too, and the epoch script holds
   the sweep's lock for a heartbeat TTL so that live processes beat again
   before anyone is taken for dead.

A live process, even one draining for minutes, keeps beating, so the sweep
never takes its jobs. The swarm parent calls ``recover`` directly the moment
it reaps a child, with the cause its wait status shows
(``supervisor.evidence``), instead of waiting a minute for the heartbeat to
lapse.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.redis.runtime import Runtime, handed
from wurk.unique import keys as unique
from wurk.wire import keys
from wurk.wire.payload import PayloadError, dumps, loads_job, now_stamp, score
from wurk.wire.recover_lua import ACCUSE, RECOVER

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.runtime.epoch import Epoch
    from wurk.settings.config import Config
    from wurk.wire.lua import Script

log = get_logger("wurk.reaper")
# The error_class of a job sent to the dead set for crashing its process.
POISON_CLASS = "ProcessCrashed"


class Evidence(enum.Enum):
    RELEASED = "released"  # a live process's stop gave its jobs back
    NONE = "none"  # died, but nothing says its jobs did it
    CRASHED = "crashed"  # died of something a job does to its own process


@dataclass(frozen=True)
class Cause:
    """Why a process's private lists are recovered; ``detail`` says how it crashed."""

    evidence: Evidence
    detail: str = ""


RELEASED = Cause(Evidence.RELEASED)
NO_EVIDENCE = Cause(Evidence.NONE)


def crashed(detail: str) -> Cause:
    return Cause(Evidence.CRASHED, detail)


def recover(runtime: Runtime, identity: str, now: float | None = None, *,
            attempts: int | None = None, cause: Cause = NO_EVIDENCE) -> tuple[int, int]:
    """Recover one identity's private lists; returns (requeued, killed as poison pills).

    ``attempts`` caps the pool's tries (the swarm parent makes one per tick).
    Only a ``crashed`` cause makes suspects and blames (see the module docstring).
    """
    at = time.time() if now is None else now
    requeued, killed, lone = _blame(runtime, identity, cause, at, attempts=attempts,
                                     script=RECOVER)
    if requeued or killed:
        log.warning("reaper.recovered", identity=identity, requeued=requeued, killed=killed,
                    cause=cause.evidence.value, detail=cause.detail or None)
    _say_killed(killed, identity, lone, cause)
    return requeued, killed


def accuse(runtime: Runtime, identity: str, detail: str, now: float | None = None, *,
           attempts: int | None = None) -> tuple[int, int]:
    """Evidence against a live process's running jobs (the swarm parent recycles it
    for memory): returns (marked as suspects, killed as poison pills)."""
    at = time.time() if now is None else now
    cause = crashed(detail)
    marked, killed, lone = _blame(runtime, identity, cause, at, attempts=attempts,
                                   script=ACCUSE)
    if marked or killed:
        log.warning("reaper.accused", identity=identity, suspects=marked, killed=killed,
                    detail=detail)
    _say_killed(killed, identity, lone, cause)
    return marked, killed


def _blame(runtime: Runtime, identity: str, cause: Cause, at: float, *, attempts: int | None,
           script: Script) -> tuple[int, int, list[Any]]:
    """Run RECOVER or ACCUSE for ``identity``: (jobs moved or marked, killed, the lone job's
    arguments)."""
    lone = _lone_job(runtime, identity, cause, at, attempts)
    reply = runtime.pool.run(lambda c: script.run(
        c, _keys(identity), _args(runtime.config, identity, cause, at, lone)), attempts=attempts)
    return int(reply[0]), int(reply[1]), lone


def _keys(identity: str) -> list[str]:
    return [keys.WIP_OWNERS, keys.wip_queues(identity), keys.DEAD, keys.QUEUES, keys.SUSPECTS]


def _args(config: Config, identity: str, cause: Cause, at: float,
          lone: list[Any]) -> list[Any]:
    return [identity, keys.wip_prefix(identity), cause.evidence.value, config.max_recoveries,
            keys.PILL_TTL, score(at), score(at - config.dead_timeout), config.dead_max_jobs,
            keys.SUSPECT_TTL, *lone]


def _say_killed(killed: int, identity: str, lone: list[Any], cause: Cause) -> None:
    if killed:
        log.error("job.poison_pill", identity=identity, jid=lone[4], detail=cause.detail)


def _lone_job(runtime: Runtime, identity: str, cause: Cause, at: float,
              attempts: int | None) -> list[Any]:
    """RECOVER's arguments for the one job a crashed process held (its payload, pill
    key, dead entry, unique lock and jid); blanks when there is no evidence, it held
    another number of jobs, or the job has no jid. Read before the script, which
    blames the job only if it is still the one held."""
    blank: list[Any] = ["", "", "", "", ""]
    if cause.evidence is not Evidence.CRASHED:
        return blank
    held = runtime.pool.run(lambda c: _first_two(c, identity), idempotent=True,
                                attempts=attempts)
    if len(held) != 1:
        return blank
    raw = held[0]
    try:
        job = loads_job(raw)
    except PayloadError:
        return blank
    jid = job.get("jid")
    if not isinstance(jid, str) or not jid:
        return blank
    return [raw, keys.pill(jid), _dead_entry(runtime.config, job, raw, cause, at), _lock(job), jid]


def _first_two(conn: Conn, identity: str) -> list[bytes]:
    """Up to two jobs per private list: enough to tell one held job from more."""
    prefix = keys.wip_prefix(identity).encode()
    held: list[bytes] = []
    for queue in conn.call("SMEMBERS", keys.wip_queues(identity)):
        held += conn.call("LRANGE", prefix + bytes(queue), 0, 1)
    return held


def _dead_entry(config: Config, job: dict[str, Any], raw: bytes, cause: Cause,
                at: float) -> str | bytes:
    crashes = config.max_recoveries + 1
    job["error_class"] = POISON_CLASS
    job["error_message"] = (
        f"it crashed its worker process {crashes} time{'s' if crashes > 1 else ''} while it "
        f"ran alone (the last: {cause.detail}), more than max_recoveries "
        f"({config.max_recoveries}), so wurk took it for a poison pill")
    job["failed_at"] = now_stamp(config.timestamps, at)
    try:
        return dumps(job)
    except Exception:  # noqa: BLE001 - a payload we cannot write back goes to dead as it was
        return raw


def _lock(job: dict[str, Any]) -> str:
    """The unique lock a dying job frees (as a death by retries exhausted does)."""
    if not unique.is_unique(job) or unique.until_of(job) != unique.SUCCESS:
        return ""
    return unique.lock_of(job) or ""


def sweep(runtime: Runtime, me: str | None = None, epoch: Epoch | None = None) -> int:
    """Recover every owner whose heartbeat expired; returns how many were recovered."""
    if epoch is not None:
        epoch.refresh()  # after a data loss, this takes the lock for the grace period
    lock_ttl = max(1, int(runtime.config.reaper_interval / 2))
    if not runtime.pool.call("SET", keys.REAPER_LOCK, me or "-", "NX", "EX", lock_ttl):
        return 0
    owners = [m.decode() for m in
              runtime.pool.call("SMEMBERS", keys.WIP_OWNERS, idempotent=True)]
    others = [o for o in owners if o != me]
    alive = runtime.pool.pipeline([("EXISTS", o) for o in others], idempotent=True)
    dead = [o for o, exists in zip(others, alive, strict=True) if not exists]
    for identity in dead:
        # A lapsed heartbeat says the process is gone, not that a job killed it.
        recover(runtime, identity, cause=NO_EVIDENCE)
    return len(dead)


class Reaper:
    def __init__(self, config: Config, identity: str, epoch: Epoch | None = None,
                 *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.identity = identity
        self.epoch = epoch
        self.service = Service("reaper", self._sweep,
                               failed=logged(log, "reaper.error", self._interval))

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop(self.runtime.pool.deadline.clip(5.0))

    def _sweep(self) -> float:
        sweep(self.runtime, self.identity, self.epoch)
        return self._interval()

    def _interval(self) -> float:
        return self.config.reaper_interval

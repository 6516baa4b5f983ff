"""Hard time limits from the parent's side: KILL a child too wedged to enforce its own.

A child's job timer enforces ``hard_timeout`` itself (``wurk.runtime.job_timer``):
it settles the job as a JobTimeout failure and recycles the child. A child
stuck in C code that holds the GIL cannot: no thread of it runs. So the child
also tells the parent, on its ready pipe, when a hard-limited job starts
(``+["jid", "queue", deadline]``, the deadline on the shared monotonic clock)
and when it ends or was settled (``-["jid"]``), one line per note, each
written whole (far below ``PIPE_BUF``) and never blocking.

Duties:
1. Child side: :func:`notes_writer` gives the job timer a writer that never
   blocks or raises (a full pipe drops the note; see duty 3).
2. Parent side: :func:`absorb` reads the notes out of what the pipe brought
   (pulses and the ready line are skipped); anything that does not parse is
   ignored, and a child's table is capped at :data:`MAX_TRACKED`.
3. :func:`overran` (every tick): a child with a job past its deadline
   plus :data:`GRACE` is to be KILLed (event ``child.overran``; the
   supervise loop KILLs it) and the job is remembered for the reap. Under
   reliable fetch the parent first checks that the job is still in the
   child's private list, so a lost ``-`` note never KILLs a healthy child.
4. :func:`settle_overran` (from ``supervisor.reaped``, before the private
   lists are recovered): the remembered job is settled as a failure with a
   JobTimeout through the same atomic settle a worker uses (retry or dead,
   never requeued as if nothing happened); the child's other jobs then go
   back to their queues unblamed (no poison-pill count, no suspect mark).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from wurk.core import logging as wlog
from wurk.core.validate import finite_float, is_text
from wurk.push.job import registry
from wurk.runtime import settle
from wurk.runtime.retry import RetryHandler
from wurk.runtime.time_limits import JobTimeout
from wurk.wire import keys
from wurk.wire.payload import PayloadError, loads_job

if TYPE_CHECKING:
    from supervisor.children import Child
    from wurk.redis.runtime import Runtime

log = wlog.get_logger("wurk.swarm")
# Past a job's hard deadline, the child's own timer gets this long to settle
# the job and say so before the parent KILLs it.
GRACE = 5.0
MAX_TRACKED = 10_000
MAX_FIELD = 200


def notes_writer(fd: int) -> Callable[[bytes], None]:
    """A writer of notes on ``fd`` (already non-blocking) that never raises."""
    def write(line: bytes) -> None:
        with contextlib.suppress(OSError):  # full pipe, or no parent to read it
            os.write(fd, line)
    return write


def absorb(child: Child, data: bytes) -> None:
    """Apply the ``+`` and ``-`` notes found in ``data`` to ``child.deadlines``."""
    for raw in data.split(b"\n"):
        line = raw.lstrip(b".")
        if line[:1] in (b"+", b"-"):
            _apply(child, line[:1], _parse(line[1:]))


def _parse(body: bytes) -> list[Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, list) and value else None


def _apply(child: Child, sign: bytes, note: list[Any] | None) -> None:
    if note is None or not _text(note[0]):
        return
    jid = note[0]
    if sign == b"-":
        child.deadlines.pop(jid, None)
        return
    if len(note) != 3 or not _text(note[1]) or not _finite(note[2]):
        return
    if len(child.deadlines) < MAX_TRACKED:
        child.deadlines[jid] = (note[1], float(note[2]))


def _text(value: Any) -> bool:
    return is_text(value, MAX_FIELD)


def _finite(value: Any) -> bool:
    return finite_float(value) is not None


def overran(children: Iterable[Child], now: float) -> list[Child]:
    """The children to KILL: each holds a job past its deadline plus GRACE (remembered
    in ``child.overran``). ``children`` are those not KILLed already."""
    found: list[Child] = []
    for child in children:
        late = {jid: queue for jid, (queue, at) in child.deadlines.items() if now >= at + GRACE}
        late = {jid: q for jid, q in late.items() if _still_held(child, jid, q)}
        if late:
            log.error("child.overran", **child.fields, jids=sorted(late), grace=GRACE)
            child.overran.update(late)
            found.append(child)
    return found


def _still_held(child: Child, jid: str, queue: str) -> bool:
    """Whether the child still holds the job; a lost ``-`` note is forgotten here."""
    config = child.slot.config
    if not config.reliable_fetch or child.identity is None:
        return True
    try:
        held = _find(child.slot.runtime, child.identity, queue, jid) is not None
    except Exception:  # noqa: BLE001 - Redis away: trust the note, the KILL is still due
        return True
    if not held:
        child.deadlines.pop(jid, None)
    return held


def _find(runtime: Runtime, identity: str, queue: str,
          jid: str) -> tuple[bytes, dict[str, Any]] | None:
    private_list = keys.wip(identity, queue)
    members = runtime.pool.run(lambda c: c.call("LRANGE", private_list, 0, -1),
                               idempotent=True, attempts=1)
    for raw in members:
        try:
            job = loads_job(raw)
        except PayloadError:
            continue
        if job.get("jid") == jid:
            return raw, job
    return None


def settle_overran(runtime: Runtime, identity: str, jobs: dict[str, str]) -> None:
    """Settle each job (jid -> queue) a KILL for overrunning took: a JobTimeout failure.

    Safe to run again: a job already settled is no longer in the private list.
    """
    config = runtime.config
    for jid, queue in jobs.items():
        found = _find(runtime, identity, queue, jid) if config.reliable_fetch else None
        if found is None:
            continue
        raw, job = found
        entry = registry.find(str(job.get("class")))
        failure = JobTimeout("job ran past its hard_timeout; its child was KILLed", hard=True)
        settlement = RetryHandler(config, runtime=runtime).plan(
            job, queue, failure, entry.options if entry else None)
        if settle.write(runtime, settlement, keys.wip(identity, queue), raw, keys.pill(jid)):
            log.warning(f"job.{settlement.outcome}", jid=jid, queue=queue, error="JobTimeout",
                        identity=identity)

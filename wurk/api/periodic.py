"""Periodic entries as Redis holds them: list, next runs, history, pause.

Reads Sidekiq Enterprise's layout (``periodic`` set, ``loops:{lid}`` hash,
``loop-history:{lid}`` list), so it lists the loops a Ruby Sidekiq
Enterprise process registered as well as wurk's entries.

Duties:
1. :class:`PeriodicSet`: every registered entry (:class:`PeriodicInfo`):
   schedule, zone, job, queue, args, pause flag, last tick handled, last
   fire, next run; one entry by name (``fetch``), the next few run times
   (``next_runs``) and the capped history of fires (``history``).
2. ``pause``/``unpause``: the ``paused`` flag in the entry's hash, which
   whichever process leads honours at its next pass. Unpausing moves the
   entry's mark to now, so ticks that fell during the pause are not
   "missed" and do not run.
3. Tolerate what Redis holds: a missing field, garbage JSON, an unknown
   zone or a schedule that no longer parses give empty values, never an
   exception (except :class:`UnknownPeriodicError` for a name not there).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from wurk.push.cron import CronError, Schedule
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.replies import hash_items, resolve, text, to_int

MAX_NEXT = 100


class UnknownPeriodicError(LookupError):
    """No periodic entry of that name is registered in Redis."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no periodic entry named {name!r} (not in the 'periodic' set)")
        self.name = name


@dataclass(frozen=True)
class PeriodicRun:
    fired_at: int
    jid: str


@dataclass(frozen=True)
class PeriodicInfo:
    name: str
    schedule: str
    tz: str
    job: str
    queue: str
    args: list[Any]
    retry: Any
    missed: str
    paused: bool
    last_tick: int | None
    last_fired_at: int | None
    next_run: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _options(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _maybe_int(raw: Any) -> int | None:
    value = to_int(raw, -1) if raw is not None else -1
    return value if value >= 0 else None


def _schedule(fields: dict[str, str]) -> Schedule | None:
    try:
        return Schedule(fields.get("schedule", ""), fields.get("tz") or "UTC")
    except CronError:
        return None


def _info(name: str, fields: dict[str, str], now: float) -> PeriodicInfo:
    options = _options(fields.get("options", ""))
    args = options.get("args", [])
    paused = fields.get("paused") == "1"
    schedule = None if paused else _schedule(fields)
    return PeriodicInfo(
        name=name, schedule=fields.get("schedule", ""), tz=fields.get("tz") or "UTC",
        job=fields.get("klass", ""), queue=str(options.get("queue") or "default"),
        args=args if isinstance(args, list) else [], retry=options.get("retry", True),
        missed=str(options.get("missed") or "once"), paused=paused,
        last_tick=_maybe_int(fields.get("tick")), last_fired_at=_maybe_int(fields.get("lf")),
        next_run=None if schedule is None else schedule.next_after(now))


class PeriodicSet:
    """The periodic entries registered in Redis."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    @property
    def _pool(self) -> Any:
        return self.runtime.pool

    def names(self) -> list[str]:
        members = self._pool.call("SMEMBERS", keys.PERIODIC, idempotent=True)
        return sorted(text(m) for m in members)

    def _fields(self, name: str) -> dict[str, str]:
        reply = self._pool.call("HGETALL", keys.loop(name), idempotent=True)
        return {text(k): text(v) for k, v in hash_items(reply)}

    def all(self, now: float | None = None) -> list[PeriodicInfo]:
        when = time.time() if now is None else now
        found = []
        for name in self.names():
            fields = self._fields(name)
            if fields:
                found.append(_info(name, fields, when))
        return found

    def fetch(self, name: str, now: float | None = None) -> PeriodicInfo:
        fields = self._fields(name)
        if not fields:
            raise UnknownPeriodicError(name)
        return _info(name, fields, time.time() if now is None else now)

    def next_runs(self, name: str, count: int = 5, now: float | None = None) -> list[int]:
        """The next ``count`` (at most 100) run times of an entry, UTC epochs."""
        fields = self._fields(name)
        if not fields:
            raise UnknownPeriodicError(name)
        schedule = _schedule(fields)
        if schedule is None or fields.get("paused") == "1":
            return []
        return schedule.upcoming(time.time() if now is None else now,
                                 max(0, min(int(count), MAX_NEXT)))

    def history(self, name: str, limit: int = keys.LOOP_HISTORY_CAP) -> list[PeriodicRun]:
        """The latest fires, newest first: ``[fired_at, jid]`` pairs."""
        self.fetch(name)
        raw = self._pool.call("LRANGE", keys.loop_history(name), 0, max(0, int(limit)) - 1,
                              idempotent=True)
        runs = []
        for item in raw:
            try:
                fired_at, jid = json.loads(text(item))
                runs.append(PeriodicRun(int(fired_at), str(jid)))
            except (ValueError, TypeError):
                continue  # a foreign or damaged record: shown as nothing, not an error
        return runs

    def pause(self, name: str) -> None:
        self.fetch(name)
        # Idempotent: setting the same flag again changes nothing.
        self._pool.call("HSET", keys.loop(name), "paused", "1", idempotent=True)

    def unpause(self, name: str, now: float | None = None) -> None:
        info = self.fetch(name)
        mark = max(info.last_tick or 0, int(time.time() if now is None else now))
        self._pool.call("HSET", keys.loop(name), "paused", "0", "tick", mark, idempotent=True)

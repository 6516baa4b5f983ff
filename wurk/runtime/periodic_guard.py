"""The tick guard: the client middleware that lets exactly one process push each tick.

It is the last step of the periodic loop's client chain (the config's
client middleware, then this). For a payload carrying a tick id
(``periodic: {"name", "tick"}``) it runs the PERIODIC_TICK script, which in
one step checks the leader's fence (the lease key still holds this
leader's value), the entry's pause flag and its mark (the last tick
handled), takes the tick's guard key (SET NX with a TTL) and records the
fire in the entry's hash and capped history. Only when all that passed does
it call ``call_next()``, and the client writes the job straight after.

Duties:
1. Fence and guard a tick's push in one Redis step; stop the push (return
   without ``call_next``) when this process is not the leader any more,
   the entry is paused or the tick was already handled, and say which in
   ``outcome``.
2. Move an entry's mark past a tick without pushing (``skip``), fenced the
   same way.
3. Register entries in Redis (``register``): the ``periodic`` set, each
   ``loops:{name}`` hash, the initial pause flag and mark kept if present.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from wurk.push.periodic import PeriodicEntry
from wurk.wire import keys
from wurk.wire.periodic_lua import PERIODIC_TICK

FIRED, SKIPPED, NOT_LEADER, PAUSED, DONE, MISSING = 1, 2, 0, -1, -2, -3
OUTCOMES = {FIRED: "fired", SKIPPED: "skipped", NOT_LEADER: "not_leader", PAUSED: "paused",
            DONE: "done", MISSING: "unregistered"}


class Lease(Protocol):
    """What the periodic loop needs of a leader (:class:`wurk.runtime.leader.Leader`)."""

    def start(self) -> Any: ...
    def stop(self) -> None: ...
    def is_leader(self) -> bool: ...
    def fence(self) -> tuple[str, str] | None: ...


class TickGuard:
    """Client middleware ``(job_class, payload, queue, redis, call_next)``."""

    def __init__(self, lease: Lease, entries: Mapping[str, PeriodicEntry],
                 clock: Callable[[], float]) -> None:
        self.lease = lease
        self.entries = entries
        self.clock = clock
        self.outcome = ""

    def __call__(self, job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], Any]) -> None:
        tick_id = payload.get("periodic")
        if not isinstance(tick_id, dict) or tick_id.get("name") not in self.entries:
            call_next()  # not a tick of ours: this step has nothing to say
            return
        entry = self.entries[tick_id["name"]]
        result = self.claim(redis, entry, int(tick_id["tick"]), "fire", str(payload["jid"]))
        self.outcome = OUTCOMES.get(result, "unknown")
        if result == FIRED:
            call_next()

    def claim(self, redis: Any, entry: PeriodicEntry, tick: int, mode: str,
              jid: str = "") -> int:
        """Run PERIODIC_TICK for ``tick`` of ``entry``; one of the outcome codes."""
        fence = self.lease.fence()
        if fence is None:
            return NOT_LEADER
        lease_key, lease_value = fence
        following = entry.schedule.next_after(tick)
        script_keys = [lease_key, keys.tick_guard(entry.name, tick), keys.loop(entry.name),
                       keys.loop_history(entry.name)]
        args = [lease_value, tick, keys.TICK_GUARD_TTL, mode, jid, int(self.clock()),
                "" if following is None else following, keys.LOOP_HISTORY_CAP]
        # Not replayed: a lost reply may hide a claim that landed, and a
        # second try would then report "done" for the tick we just claimed.
        return int(redis.run(lambda c: PERIODIC_TICK.run(c, script_keys, args)))

    def skip(self, redis: Any, entry: PeriodicEntry, tick: int) -> str:
        result = self.claim(redis, entry, tick, "skip")
        return OUTCOMES.get(result, "unknown")


def register(redis: Any, entries: Sequence[PeriodicEntry], now: float) -> None:
    """Write each entry's declaration; an existing pause flag and mark are kept
    (a pause from the admin CLI survives restarts and deploys)."""
    commands: list[tuple[Any, ...]] = []
    for entry in entries:
        fields = entry.loop_fields()
        key = keys.loop(entry.name)
        commands.append(("SADD", keys.PERIODIC, entry.name))
        commands.append(("HSET", key, *[x for kv in fields.items() for x in kv]))
        commands.append(("HSETNX", key, "paused", "1" if entry.paused else "0"))
        # Ticks before the first registration are not "missed".
        commands.append(("HSETNX", key, "tick", int(now)))
    if commands:
        redis.pipeline(commands, idempotent=True)


def read_marks(redis: Any, entries: Sequence[PeriodicEntry]) -> list[tuple[int | None, bool]]:
    """(mark, paused) per entry; a mark that is missing or garbage is None."""
    replies = redis.pipeline([("HMGET", keys.loop(e.name), "tick", "paused") for e in entries],
                             idempotent=True)
    return [(_as_int(tick), paused in (b"1", "1")) for tick, paused in replies]


def _as_int(raw: Any) -> int | None:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if 0 <= value < 2**40 else None

"""One entry of the scheduled, retry or dead set, and the moves it can make.

Duties:
1. Carry the exact member bytes and its score (``at``), so every removal is
   a ZREM of that member and never touches a look-alike.
2. ``retry`` / ``add_to_queue``: remove first, and push through
   :class:`wurk.Client` only if this caller's ZREM removed it, so two
   operators (or a UI and a script) racing never push twice. ``retry``
   decrements ``retry_count`` as Sidekiq does. A push that cannot reach
   Redis waits in the client's push buffer (``reliable_push``); one that
   fails outright leaves the entry gone, as in Sidekiq, and its payload is
   logged for a manual restore.
3. ``kill``: move to ``dead`` in one MULTI with the removal, only while the
   entry is still there (WATCH), then run the death handlers.
4. ``delete`` and ``reschedule``, both replay-safe.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from wurk.api.errors import JobKilledError
from wurk.api.records import JobRecord
from wurk.core.logging import get_logger
from wurk.redis.pools import pool_for
from wurk.runtime.retry import kill_commands
from wurk.wire.payload import loads_job, score

if TYPE_CHECKING:
    from wurk.push.client import Client
    from wurk.redis.connection import Conn
    from wurk.settings.config import Config

log = get_logger("wurk.api")
# A kill retries its WATCH this often when other writers keep changing the set.
KILL_ATTEMPTS = 10


def run_death_handlers(config: Config, item: Mapping[str, Any]) -> None:
    error = JobKilledError("Job killed by API")
    for handler in config.death_handlers:
        try:
            handler(item, error)
        except Exception as hook_error:  # noqa: BLE001 - one bad hook must not stop the move
            log.warning("api.death_handler_failed", error=repr(hook_error),
                        jid=item.get("jid"))


class EntrySet(Protocol):
    """What an entry needs of the sorted set it came from (``wurk.api.sorted_sets``)."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def client(self) -> Client: ...


class SortedEntry(JobRecord):
    def __init__(self, parent: EntrySet, at: float, value: bytes | str) -> None:
        super().__init__(value, config=parent.config)
        self.parent = parent
        self.score = at

    @property
    def at(self) -> float:
        """The score: run-at (schedule/retry) or time of death, epoch seconds."""
        return self.score

    def delete(self) -> bool:
        """Remove this entry; False if it was already gone."""
        # Replay-safe for the set (removing an absent member is a no-op); a
        # replay after a lost reply reports False for a removal that happened.
        return bool(pool_for(self.config).call("ZREM", self.parent.name, self.value,
                                          idempotent=True))

    def reschedule(self, at: float) -> bool:
        """Move this entry to ``at``; False if it is no longer in the set."""
        # Replay-safe: an absolute score for one exact member, and XX never
        # re-creates an entry someone else removed (Sidekiq's ZINCRBY would).
        replies = pool_for(self.config).pipeline(
            [("ZADD", self.parent.name, "XX", score(at), self.value),
             ("ZSCORE", self.parent.name, self.value)], idempotent=True)
        if replies[1] is None:
            return False
        self.score = float(replies[1])
        return True

    def add_to_queue(self) -> bool:
        """Push the job to its queue now; False if someone else took the entry."""
        return self._move_to_queue(decrement=False)

    def retry(self) -> bool:
        """As ``add_to_queue``, with ``retry_count`` decremented (Sidekiq's retry)."""
        return self._move_to_queue(decrement=True)

    def _move_to_queue(self, *, decrement: bool) -> bool:
        item = loads_job(self.value)  # an unpushable payload stays where it is
        if not self._claim():
            return False
        count = item.get("retry_count")
        if decrement and isinstance(count, int) and not isinstance(count, bool):
            item["retry_count"] = count - 1
        item.pop("at", None)
        try:
            pushed = self.parent.client.push(item)
        except Exception:
            # Sidekiq's window too: the entry is gone and the push failed. Log
            # the exact payload so an operator can put it back by hand.
            log.error("api.push_failed", set=self.parent.name, jid=self.jid,
                      payload=self.value.decode() if isinstance(self.value, bytes)
                      else self.value)
            raise
        if pushed is None:
            # A client middleware chose not to push it (as Sidekiq's API, the
            # entry is gone all the same); say so, with the payload.
            log.warning("api.push_stopped", set=self.parent.name, jid=self.jid,
                        payload=self.value.decode() if isinstance(self.value, bytes)
                        else self.value)
        return True

    def _claim(self) -> bool:
        # Not replay-safe, deliberately: the reply decides who pushes. After a
        # lost reply a replay would read 0 and nobody would push the job, so the
        # pool raises instead and the operator sees the error.
        return bool(pool_for(self.config).call("ZREM", self.parent.name, self.value) == 1)

    def kill(self) -> bool:
        """Move to the morgue; False if the entry was already gone."""
        # Replay-safe: a replay finds the member gone and changes nothing; it
        # reports False (and skips the handlers) for a move that happened.
        moved = pool_for(self.config).run(self._kill_watched, idempotent=True)
        if moved:
            run_death_handlers(self.config, self.item)
        return moved

    def _kill_watched(self, conn: Conn) -> bool:
        """ZREM + Sidekiq's DeadSet#kill in one MULTI, only if the member is still there.

        Without the WATCH a kill racing a retry would leave the job both
        queued and dead.
        """
        name = self.parent.name
        for _ in range(KILL_ATTEMPTS):
            conn.call("WATCH", name)
            if conn.call("ZSCORE", name, self.value) is None:
                conn.call("UNWATCH")
                return False
            commands = [("ZREM", name, self.value),
                        *kill_commands(self.config, self.value, time.time())]
            replies = conn.pipeline(commands, transaction=True)
            if replies != [None]:  # None: EXEC aborted because the set changed
                return bool(replies[0])
        raise RuntimeError(f"{name} kept changing; could not kill {self.jid}")

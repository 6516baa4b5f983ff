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
3. ``kill``: move to ``dead`` in one script with the removal, only while
   the entry is still there, then run the death handlers.
4. ``delete`` and ``reschedule``, both replay-safe; a delete from ``dead``
   drops the entry's note with it. A delete or kill ends what the job
   holds in the same script (``wurk.api.removal``): its unique lock, its
   batch count, its result waiters.
5. Name itself: ``handle`` is the jid, or for an entry with none a person
   can type (not JSON, no jid, one holding a lone surrogate) ``raw-`` and a
   digest of its bytes. In ``dead``, the reason wurk noted for an entry kept
   as raw bytes (``wurk.wire.dead_notes``) is its ``error_class`` and
   ``error_message``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from wurk.api import removal
from wurk.api.errors import JobKilledError
from wurk.api.records import JobRecord
from wurk.core.logging import get_logger
from wurk.core.validate import is_whole
from wurk.push.prepare import epoch_seconds
from wurk.wire import dead_notes, keys
from wurk.wire.payload import loads_job, score

if TYPE_CHECKING:
    from wurk.push.client import Client
    from wurk.settings.config import Config

log = get_logger("wurk.api")


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


# The longest jid a handle shows as it is; anything else is named by digest.
MAX_SHOWN_JID = 200


class SortedEntry(JobRecord):
    def __init__(self, parent: EntrySet, at: float, value: bytes | str) -> None:
        super().__init__(value, config=parent.config)
        self.parent = parent
        self.score = at
        self._note: dict[str, Any] | None = None if parent.name == keys.DEAD else {}

    @property
    def at(self) -> float:
        """The score: run-at (schedule/retry) or time of death, epoch seconds."""
        return self.score

    @property
    def handle(self) -> str:
        """What names this entry to a person: its jid, or ``raw-<digest>``
        when it has none that can be typed and printed."""
        jid = self.jid
        if jid and not self.scrubbed and len(jid) <= MAX_SHOWN_JID and jid.isprintable() \
                and not any(c.isspace() or c == "/" for c in jid):
            return jid
        return dead_notes.handle(self.value)

    @property
    def note(self) -> dict[str, Any]:
        """Why wurk sent this entry to dead as raw bytes ({} if it did not)."""
        if self._note is None:
            self._note = dead_notes.parse_note(self.runtime.pool.call(
                "HGET", keys.DEAD_NOTES, dead_notes.digest(self.value), idempotent=True))
        return self._note

    @property
    def error_class(self) -> str | None:
        noted = self.note.get("error_class")
        return noted if isinstance(noted, str) else super().error_class

    @property
    def error_message(self) -> str | None:
        noted = self.note.get("error_message")
        return noted if isinstance(noted, str) else super().error_message

    def delete(self) -> bool:
        """Remove this entry, with what it holds; False if it was already gone."""
        # Replay-safe for the set (removing an absent member is a no-op); a
        # replay after a lost reply reports False for a removal that happened.
        return self._remove(killed=False)

    def _remove(self, *, killed: bool) -> bool:
        """ZREM (and for a kill, ZADD to dead) with the job's lock, batch count and
        result waiters, in one script (``wurk.api.removal``)."""
        name = self.parent.name
        [removed] = removal.remove(self.runtime, name, removal.ZSET, [self.value],
                                   removal.Ending(name, killed=killed), idempotent=True)
        return removed

    def reschedule(self, at: float) -> bool:
        """Move this entry to ``at``; False if it is no longer in the set.

        ``at`` passes the push's own check (finite, before the year 5138), or
        :class:`wurk.ArgumentError`.
        """
        at = epoch_seconds(at, "reschedule's time")
        # Replay-safe: an absolute score for one exact member, and XX never
        # re-creates an entry someone else removed (Sidekiq's ZINCRBY would).
        replies = self.runtime.pool.pipeline(
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
        if decrement and is_whole(count):
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
        return bool(self.runtime.pool.call("ZREM", self.parent.name, self.value) == 1)

    def kill(self) -> bool:
        """Move to the morgue; False if the entry was already gone.

        The job failed for good: its lock goes, its batch counts a death, a
        result waiter is told it was killed; then the death handlers run.
        """
        # Replay-safe: a replay finds the member gone and changes nothing; it
        # reports False (and skips the handlers) for a move that happened. One
        # script, so a kill racing a retry never leaves the job queued and dead.
        moved = self._remove(killed=True)
        if moved:
            run_death_handlers(self.config, self.item)
        return moved

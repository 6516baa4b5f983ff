"""Job records: one job as it sits in a queue list, read for display and removal.

Duties:
1. Keep the raw value exactly as Redis returned it, so a removal (LREM,
   ZREM) matches byte for byte and payload keys wurk does not know survive.
2. Parse leniently, as Sidekiq's API does: malformed JSON gives an empty
   item whose ``args`` hold the raw text, so one bad entry never breaks a
   listing; strings no UTF-8 writer can carry (lone surrogates) are shown
   with the surrogate as a ``\\udXXX`` escape, so a page or a terminal
   can print them (``scrubbed``).
3. Read Sidekiq's fields in every version's shape: the display class
   (``display_class``, then ActiveJob's wrapped job: ``wurk.wire.activejob``),
   timestamps as float seconds
   or Sidekiq 8's integer ms, failure fields and the compressed backtrace.
4. ``delete`` one queued job: LREM 1 of the exact value and, in the same
   script, end what it holds (its unique lock, its batch count, its result
   waiters: ``wurk.api.removal``), as every end of a job does.
   ``release_lock`` gives back only the lock.
"""

from __future__ import annotations

import binascii
import time
import zlib
from typing import Any

from wurk.api import removal
from wurk.core.logging import get_logger
from wurk.core.validate import is_whole
from wurk.redis.runtime import runtime_for
from wurk.runtime.retry import decode_backtrace
from wurk.settings.config import Config
from wurk.unique import keys as unique
from wurk.unique.push import give_back
from wurk.wire import activejob, keys
from wurk.wire.payload import parse_item, to_seconds, unwritable_field, writable
from wurk.wire.replies import resolve, text

log = get_logger("wurk.api")


def _seconds(value: Any) -> float | None:
    # A float is seconds; a large integer is Sidekiq 8's ms (spec §0.2).
    return to_seconds(value)


def _may_hold_surrogates(value: bytes | str) -> bool:
    """Cheap: an escape, or (for bytes) the lead byte of an encoded surrogate."""
    if isinstance(value, str):
        return not value.isascii()
    return b"\\ud" in value or b"\\uD" in value or b"\xed" in value


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value if writable(value) else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    if isinstance(value, dict):
        return {_scrub(key): _scrub(item) for key, item in value.items()}
    return value


class JobRecord:
    """A queued job: ``value`` is the raw entry, ``item`` the parsed payload."""

    def __init__(self, value: bytes | str, queue: str | None = None, *,
                 config: Config | None = None) -> None:
        self.value = value
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)
        parsed = parse_item(value)
        self.scrubbed = parsed is not None and _may_hold_surrogates(value) \
            and unwritable_field(parsed) is not None
        if self.scrubbed:
            parsed = _scrub(parsed)
        self.valid = parsed is not None
        self.item: dict[str, Any] = parsed if parsed is not None else {}
        self.queue = queue or text(self.item.get("queue"))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.klass} jid={self.jid} queue={self.queue}>"

    def __getitem__(self, key: str) -> Any:
        return self.item.get(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.item.get(key, default)

    # -- identity ---------------------------------------------------------
    @property
    def jid(self) -> str | None:
        jid = self.item.get("jid")
        return jid if isinstance(jid, str) else None

    @property
    def class_name(self) -> str | None:
        """The ``class`` field verbatim (what a server constantizes)."""
        name = self.item.get("class")
        return name if isinstance(name, str) else None

    @property
    def klass(self) -> str | None:
        """The class a person would recognise: ``display_class``, then the
        ActiveJob wrapped class (mailers as ``Mailer#method``), then ``class``."""
        shown = self.item.get("display_class")
        if isinstance(shown, str):
            return shown
        if activejob.is_wrapped(self.item):
            return activejob.display_class(self.item, self.args) or self.class_name
        return self.class_name

    display_class = klass

    @property
    def args(self) -> list[Any]:
        if not self.valid:
            return [text(self.value)]
        args = self.item.get("args")
        return args if isinstance(args, list) else []

    @property
    def display_args(self) -> list[Any]:
        """Args as the Web UI shows them: ActiveJob's inner arguments, encryption hidden."""
        args = list(self.args)
        if activejob.is_wrapped(self.item):
            return activejob.display_args(self.item, args)
        if self.item.get("encrypt") and args:
            args[-1] = "[encrypted data]"
        return args

    @property
    def tags(self) -> list[Any]:
        tags = self.item.get("tags")
        return tags if isinstance(tags, list) else []

    # -- time -------------------------------------------------------------
    @property
    def enqueued_at(self) -> float | None:
        return _seconds(self.item.get("enqueued_at"))

    @property
    def created_at(self) -> float | None:
        """Seconds; falls back to ``enqueued_at`` as Sidekiq does."""
        created = _seconds(self.item.get("created_at"))
        return created if created is not None else self.enqueued_at

    @property
    def latency(self) -> float:
        """Seconds since enqueue (or creation); 0 for a job with neither stamp."""
        since = self.enqueued_at if self.enqueued_at is not None else self.created_at
        return 0.0 if since is None else time.time() - since

    # -- failure fields (spec §6) -----------------------------------------
    @property
    def error_class(self) -> str | None:
        value = self.item.get("error_class")
        return value if isinstance(value, str) else None

    @property
    def error_message(self) -> str | None:
        value = self.item.get("error_message")
        return value if isinstance(value, str) else None

    @property
    def has_error(self) -> bool:
        return self.error_class is not None

    @property
    def failed_at(self) -> float | None:
        return _seconds(self.item.get("failed_at"))

    @property
    def retried_at(self) -> float | None:
        return _seconds(self.item.get("retried_at"))

    @property
    def retry_count(self) -> int | None:
        count = self.item.get("retry_count")
        return count if is_whole(count) else None

    @property
    def error_backtrace(self) -> list[str] | None:
        """The decoded lines; None when absent or undecodable (very old Marshal data)."""
        value = self.item.get("error_backtrace")
        if isinstance(value, list):
            return [str(line) for line in value]  # pre-compression format
        if not isinstance(value, str):
            return None
        try:
            return decode_backtrace(value)
        except (binascii.Error, zlib.error, ValueError, RecursionError):
            return None

    # -- removal ----------------------------------------------------------
    def delete(self) -> bool:
        """Remove this job from its queue, with what it holds; False if it was already gone.

        In the same script as the LREM: its unique lock goes, its batch counts
        it as a job that will never run, a result waiter is told it was
        deleted (``wurk.api.removal``).
        """
        queue = keys.queue(self.queue)
        # Not replay-safe: after a lost reply, a replay would remove a second,
        # byte-identical copy of the job (a requeue can produce one).
        [removed] = removal.remove(self.runtime, queue, removal.LIST, [self.value],
                                   removal.Ending(queue), idempotent=False)
        return removed

    def release_lock(self) -> bool:
        """Give back the unique lock this job holds, if it still holds it.

        A job a person deleted or killed never runs again, so a duplicate may
        be pushed now; a lock another push took since is left alone.
        """
        if not self.valid or not unique.is_unique(self.item) or not isinstance(self.jid, str):
            return False
        key = unique.lock_of(self.item)
        if key is None:
            return False
        try:
            return give_back([{unique.LOCK: key, "jid": self.jid}], self.runtime.pool) == 1
        except Exception as exc:  # noqa: BLE001 - the lock's TTL ends it; the removal stands
            log.warning("api.unique_release_failed", jid=self.jid, lock=key,
                        error=f"{type(exc).__name__}: {exc}")
            return False

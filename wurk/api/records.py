"""Job records: one job as it sits in a queue list, read for display and removal.

Duties:
1. Keep the raw value exactly as Redis returned it, so a removal (LREM,
   ZREM) matches byte for byte and payload keys wurk does not know survive.
2. Parse leniently, as Sidekiq's API does: malformed JSON gives an empty
   item whose ``args`` hold the raw text, so one bad entry never breaks a
   listing.
3. Read Sidekiq's fields in every version's shape: the display class
   (``display_class``, then ActiveJob's wrapped job: ``wurk.wire.activejob``),
   timestamps as float seconds
   or Sidekiq 8's integer ms, failure fields and the compressed backtrace.
4. ``delete`` one queued job: LREM 1 of the exact value.
"""

from __future__ import annotations

import binascii
import time
import zlib
from typing import Any

from wurk.api.common import resolve, text
from wurk.redis.pools import pool_for
from wurk.runtime.retry import decode_backtrace
from wurk.settings.config import Config
from wurk.wire import activejob, keys
from wurk.wire.payload import parse_item, to_seconds


def _seconds(value: Any) -> float | None:
    # A float is seconds; a large integer is Sidekiq 8's ms (spec §0.2).
    return to_seconds(value)


class JobRecord:
    """A queued job: ``value`` is the raw entry, ``item`` the parsed payload."""

    def __init__(self, value: bytes | str, queue: str | None = None, *,
                 config: Config | None = None) -> None:
        self.value = value
        self.config = resolve(config)
        parsed = parse_item(value)
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
        return count if isinstance(count, int) and not isinstance(count, bool) else None

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
        """Remove this job from its queue; False if it was already gone."""
        # Not replay-safe: after a lost reply, a replay would remove a second,
        # byte-identical copy of the job (a requeue can produce one).
        removed = pool_for(self.config).call("LREM", keys.queue(self.queue), 1, self.value)
        return bool(removed)

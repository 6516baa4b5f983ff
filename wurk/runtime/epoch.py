"""What this process knows of Redis's data epoch, and noticing when Redis lost its data.

Duties:
1. :meth:`Epoch.refresh` (run by the heartbeat at every beat and by the
   reaper before each sweep) reads ``wurk:epoch`` in one script, setting it
   if it is gone (``wurk.wire.epoch``); another process may set it first,
   and its token is adopted.
2. A token other than the one learned before means Redis lost its data:
   logged once (``redis.data_lost``), and each listener is told (reliable
   fetch registers its private lists again before its next blocking move).
3. :attr:`Epoch.current` is read without a round trip: reliable fetch
   stamps each claimed job with it, and a failed job's settle hands it to
   SETTLE, which writes the outcome of a job whose copy went with the data
   and writes nothing for one a recovery took (``wurk.runtime.settle``).

Nothing here raises into a job: a refresh that fails is its caller's to log
and try again; until the first success the token is "" and settles behave
as they did before epochs existed.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from wurk.core.logging import get_logger
from wurk.core.threads import describe
from wurk.redis.runtime import Runtime, handed
from wurk.wire import keys
from wurk.wire.epoch import EPOCH, TOKEN_BYTES, parse_epoch

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.epoch")


class Epoch:
    def __init__(self, config: Config, *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        # "" until a refresh lands; a str is swapped whole, so readers need no lock.
        self.current = ""
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def on_lost(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the refreshing thread) at each data loss seen."""
        self._listeners.append(listener)

    def refresh(self) -> str:
        """Read (or set) the epoch; raises on Redis trouble, for the caller to retry later."""
        with self._lock:
            known = self.current
            candidate = secrets.token_hex(TOKEN_BYTES)
            # Replay-safe: a replay finds the token the first attempt set.
            reply = self.runtime.pool.run(lambda c: EPOCH.run(
                c, [keys.EPOCH, keys.REAPER_LOCK], [candidate, known, keys.HEARTBEAT_TTL]),
                idempotent=True)
            token = parse_epoch(reply)
            if not token or token == known:
                return known
            self.current = token
        if known:
            log.warning("redis.data_lost", epoch=token, was=known,
                        hint="Redis restarted without its data, failed over to an empty "
                             "replica or was flushed: failed jobs held then are settled anyway")
            for listener in self._listeners:
                try:
                    listener()
                except Exception as exc:  # noqa: BLE001 - one listener never stops the others
                    log.error("epoch.listener_failed", error=describe(exc))
        return token

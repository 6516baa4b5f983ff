"""Lua scripts run by SHA, with a NOSCRIPT fallback that loads and retries.

Each multi-step atomic operation is a named script here, so reviewing what
runs inside Redis means reading one file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as rx

from wurk.redis_pool import Conn


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324

    def run(self, conn: Conn, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA; on NOSCRIPT (a restarted or flushed Redis) load it and go again.

        NOSCRIPT is an error reply, so nothing ran: the second attempt is safe.
        """
        try:
            return conn.call("EVALSHA", self.sha, len(keys), *keys, *args)
        except rx.NoScriptError:
            conn.call("SCRIPT", "LOAD", self.source)
            return conn.call("EVALSHA", self.sha, len(keys), *keys, *args)


# Pop the first member of a sorted set whose score is at most ARGV[1].
# The same contract as Sidekiq's poller script (its 6.4 SHA differs only in
# whitespace), so a mixed fleet agrees on what "due" means.
ZPOPBYSCORE = Script(
    "zpopbyscore",
    """
local key, now = KEYS[1], ARGV[1]
local jobs = redis.call("zrangebyscore", key, "-inf", now, "limit", 0, 1)
if jobs[1] then
  redis.call("zrem", key, jobs[1])
  return jobs[1]
end
return nil
""",
)

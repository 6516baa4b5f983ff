"""Redis's data epoch: the script that reads it, or sets it when it is gone.

Duties:
1. ``EPOCH``: return the token held in ``wurk:epoch``, creating it when it is
   missing (or holds something wurk never writes), so every process of a
   cluster adopts the same token whoever sets it first.
2. When the caller knew another token, Redis lost its data since: the
   script holds the reaper's lock for a heartbeat TTL, so no sweep takes
   the private lists of live processes whose heartbeats went with the data
   and have not been written again yet.
3. :func:`parse_epoch`: a strict reading of the reply, which is not trusted.

SETTLE (:mod:`wurk.wire.lua`) compares the token a job was claimed under with
the key, which is how a settle tells a lost copy from a recovered one. The
script lives beside :mod:`wurk.wire.lua` rather than in it only to keep each
file short; it runs through the same :class:`~wurk.wire.lua.Script`.
"""

from __future__ import annotations

import re
from typing import Any

from wurk.wire.lua import Script

TOKEN_BYTES = 8
_TOKEN = re.compile(rb"[0-9a-f]{1,64}")

# KEYS: the epoch key, the reaper's lock.
# ARGV: a fresh token (used if the key must be set), the token the caller
#       knew ("" if none), how long the reaper waits after a loss (seconds).
# Returns the token now in force.
# Reading costs nothing more than a GET; the DEL before the SET frees first,
# so that the write goes through at maxmemory (see wurk.wire.lua).
EPOCH = Script(
    "epoch",
    """
local current = redis.pcall("get", KEYS[1])
if type(current) ~= "string" or #current > 64 or not string.match(current, "^[0-9a-f]+$") then
  redis.call("del", KEYS[1])
  redis.call("set", KEYS[1], ARGV[1])
  current = ARGV[1]
end
if ARGV[2] ~= "" and current ~= ARGV[2] then
  redis.call("set", KEYS[2], "data-lost", "EX", ARGV[3])
end
return current
""",
)


def parse_epoch(reply: Any) -> str:
    """The token, or "" for a reply that is not one (never trusted as given)."""
    if isinstance(reply, str):
        reply = reply.encode()
    if isinstance(reply, bytes) and _TOKEN.fullmatch(reply):
        return reply.decode()
    return ""

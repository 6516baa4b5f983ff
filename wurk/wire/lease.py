"""Leases in Redis: the Lua scripts behind leader election, and the lease value.

Duties:
1. ``LEASE_ACQUIRE``: take a free lease (``SET NX PX``) under a new fencing
   token, or say how long the current holder's lease has left.
2. ``LEASE_RENEW`` and ``LEASE_RELEASE``: compare-and-PEXPIRE and
   compare-and-DEL, so a holder only ever extends or drops its own tenure.
3. :func:`lease_value` and :func:`parse_acquired`: the value's format
   (``"<token> <holder>"``) and a strict reading of the acquire reply, which
   comes from Redis and is not trusted.

These scripts live beside :mod:`wurk.wire.lua` rather than in it only to
keep each file short; they run through the same :class:`~wurk.wire.lua.Script`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wurk.wire.lua import Script

# Tokens stay below 2**53 so that Lua's doubles hold them exactly.
TOKEN_MAX = 2**53 - 1

# KEYS: the lease, the token counter.
# ARGV: this candidate's holder string, the TTL in ms, and the value of a
#       tenure of ours that ended without a release ("" when none).
# Returns {1, value} when the lease is ours, else {0, ms the lease has left}.
#
# 1. Our own ended tenure is dropped first, so a holder that could not renew
#    in time starts a new tenure (a new token) at once instead of waiting.
# 2. A lease already carrying our holder string is one an earlier attempt of
#    ours took while its reply was lost: adopted, so no lease is orphaned.
# 3. A lease that is not a string or has no expiry was not written by a
#    lease holder: it is given one, so garbage cannot block the election.
# 4. The token is max(last token + 1, the server's clock in ms): it keeps
#    growing when the counter is lost (a restart without persistence, a
#    failover to a lagging replica, an eviction) as long as the cluster
#    takes fewer than one lease per millisecond on average.
LEASE_ACQUIRE = Script(
    "lease_acquire",
    """
local lease, counter = KEYS[1], KEYS[2]
local holder, ttl, previous = ARGV[1], ARGV[2], ARGV[3]
local current = redis.pcall('GET', lease)
if previous ~= '' and current == previous then
  redis.call('DEL', lease)
  current = false
end
if current then
  if type(current) == 'string' then
    local gap = string.find(current, ' ', 1, true)
    if gap and string.sub(current, gap + 1) == holder then
      redis.call('PEXPIRE', lease, ttl)
      return {1, current}
    end
  end
  local left = redis.call('PTTL', lease)
  if left < 0 then
    redis.call('PEXPIRE', lease, ttl)
    left = tonumber(ttl)
  end
  return {0, left}
end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local last = redis.pcall('GET', counter)
last = type(last) == 'string' and tonumber(last) or 0
if last ~= last or last < 0 or last >= 9007199254740991 then
  last = 0
end
local token = string.format('%d', math.max(math.floor(last) + 1, now_ms))
redis.call('SET', counter, token)
local value = token .. ' ' .. holder
redis.call('SET', lease, value, 'NX', 'PX', ttl)
return {1, value}
""",
)

# KEYS: the lease. ARGV: the value we hold, the TTL in ms. 1 when extended.
LEASE_RENEW = Script(
    "lease_renew",
    """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
""",
)

# KEYS: the lease. ARGV: the value we hold. 1 when it was ours and is gone.
LEASE_RELEASE = Script(
    "lease_release",
    """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)


class BadLeaseReplyError(ValueError):
    """Redis answered the acquire script with something it never returns."""


@dataclass(frozen=True)
class Acquired:
    value: str
    token: int


def lease_value(token: int, holder: str) -> str:
    return f"{token} {holder}"


def parse_acquired(reply: Any, holder: str) -> Acquired | float:
    """The acquire reply: the tenure we got, or the seconds the holder's lease has left."""
    if not isinstance(reply, list) or len(reply) != 2 or reply[0] not in (0, 1):
        raise BadLeaseReplyError(f"unexpected lease reply {reply!r:.200}")
    flag, body = reply
    if flag == 0:
        if not isinstance(body, int) or body < 0:
            raise BadLeaseReplyError(f"unexpected lease time left {body!r:.200}")
        return body / 1000.0
    if not isinstance(body, bytes):
        raise BadLeaseReplyError(f"unexpected lease value {body!r:.200}")
    value = body.decode("utf-8", "replace")
    token, _, owner = value.partition(" ")
    numeric = token.isascii() and token.isdigit()
    if owner != holder or not numeric or not 0 < int(token) <= TOKEN_MAX:
        raise BadLeaseReplyError(f"lease value {value!r:.200} is not one of ours")
    return Acquired(value, int(token))

"""The limiters' Lua scripts: each check is one atomic script, one round trip.

Every script reads the clock from Redis (``TIME``), never from the caller,
so hosts with skewed clocks still share one limit. Every check script may
also register its limiter (``SADD lmtr-list``, ``HSET lmtr:<name>``) in the
same call, which the caller asks for once an hour per limiter object; the
check then costs no extra round trip for it.

Replies carry numbers as strings: Redis turns a Lua number into an integer.
A check replies ``{1, used, at}`` when admitted (``at``: Redis time of the
admission, seconds) and ``{0, used, wait}`` when refused (``wait``: seconds
until room may appear, or "" when only a release can make it).

State that is not what the script wrote (a wrong-type key, a counter that
is not a number) is refused with an error reply starting ``WURKLIMITER``,
which ``wurk.limiter`` turns into a :class:`~wurk.limiter.base.LimiterStateError`.
"""

from __future__ import annotations

from wurk.wire.lua import Script

# Shared head of every check. KEYS[1] is the state key, KEYS[#KEYS-1] the
# limiter's meta hash and KEYS[#KEYS] the limiter list; ARGV[1..4] are the
# register flag ("1" or "0"), the limiter's name, its type and its options
# as JSON; ARGV[5] the key TTL in seconds. A wrong-type state key is found
# before anything is written.
_CLOCK = """
local t = redis.call("time")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""
_HEAD = """
local function fmt(x) return string.format("%.6f", x) end
local function finite(x) return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge end
local function bad(why, key)
  return redis.error_reply("WURKLIMITER " .. (key or KEYS[1]) .. " " .. why)
end
local state_type = redis.call("type", KEYS[1])["ok"]
if state_type ~= "none" and state_type ~= EXPECTED then
  return bad("holds a " .. state_type .. ", not a " .. EXPECTED)
end
local meta_type = redis.call("type", KEYS[#KEYS - 1])["ok"]
if meta_type ~= "none" and meta_type ~= "hash" then
  return bad("holds a " .. meta_type .. ", not a hash", KEYS[#KEYS - 1])
end
if ARGV[1] == "1" then
  redis.call("sadd", KEYS[#KEYS], ARGV[2])
  redis.call("hset", KEYS[#KEYS - 1], "type", ARGV[3], "options", ARGV[4])
  redis.call("expire", KEYS[#KEYS - 1], tonumber(ARGV[5]))
end
"""


def _check(expected: str, body: str, prelude: str = "") -> str:
    return f'local EXPECTED = "{expected}"\n' + _CLOCK + prelude + _HEAD + body


# Concurrent: at most ARGV[6] holders, each a member of the ZSET KEYS[1]
# scored by its lease's expiry (now + ARGV[7]). Expired holders are evicted
# first and counted as ``reclaimed`` in the stats hash KEYS[2]. A member
# already present (a replay of a check that landed) is admitted again
# without a second slot, so the check is safe to replay.
# KEYS: holders ZSET, stats HASH, meta, list. ARGV: head, limit, lease, member.
CONCURRENT_ACQUIRE = Script("limiter_concurrent_acquire", _check("zset", """
local limit, lease, member = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local reclaimed = redis.call("zremrangebyscore", KEYS[1], "-inf", now)
if reclaimed > 0 then
  redis.call("hincrby", KEYS[2], "reclaimed", reclaimed)
  redis.call("expire", KEYS[2], tonumber(ARGV[5]))
end
local held = redis.call("zcard", KEYS[1])
if redis.call("zscore", KEYS[1], member) then return {1, tostring(held), fmt(now)} end
if held < limit then
  redis.call("zadd", KEYS[1], now + lease, member)
  redis.call("expire", KEYS[1], tonumber(ARGV[5]))
  return {1, tostring(held + 1), fmt(now)}
end
return {0, tostring(held), ""}
"""))

# Release a holder. A holder already gone outlived its lease (its slot was
# reclaimed and perhaps given to another): counted as an ``overage``.
# KEYS: holders ZSET, stats HASH. ARGV: member, key TTL.
CONCURRENT_RELEASE = Script("limiter_concurrent_release", """
if redis.call("zrem", KEYS[1], ARGV[1]) == 0 then
  redis.call("hincrby", KEYS[2], "overages", 1)
  redis.call("expire", KEYS[2], tonumber(ARGV[2]))
  return 0
end
return 1
""")

# Extend a live holder's lease to now + ARGV[2]; 0 if it is no longer held.
# KEYS: holders ZSET. ARGV: member, lease.
CONCURRENT_RENEW = Script("limiter_concurrent_renew", """
local t = redis.call("time")
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expiry = redis.call("zscore", KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call("zadd", KEYS[1], "xx", now + tonumber(ARGV[2]), ARGV[1])
return 1
""")

# Window (sliding): at most ARGV[6] admissions in any ARGV[7] seconds. Each
# admission is a member of the ZSET KEYS[1] scored by its time; those at
# least an interval old are trimmed first. A member already present (a
# replay) is admitted again without counting twice.
# KEYS: admissions ZSET, meta, list. ARGV: head, limit, interval, member.
WINDOW_ACQUIRE = Script("limiter_window_acquire", _check("zset", """
local limit, interval, member = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
redis.call("zremrangebyscore", KEYS[1], "-inf", now - interval)
local count = redis.call("zcard", KEYS[1])
if redis.call("zscore", KEYS[1], member) then return {1, tostring(count), fmt(now)} end
if count < limit then
  redis.call("zadd", KEYS[1], now, member)
  redis.call("pexpire", KEYS[1], math.ceil(interval * 1000) + 1000)
  return {1, tostring(count + 1), fmt(now)}
end
local oldest = redis.call("zrange", KEYS[1], 0, 0, "withscores")
return {0, tostring(count), fmt(tonumber(oldest[2]) + interval - now)}
"""))

# Bucket (fixed window): at most ARGV[6] admissions per interval of ARGV[7]
# seconds, the intervals aligned to the epoch (floor(now / interval)); one
# counter per interval, ``lmtr-b:<name>:<epoch>``, that expires two
# intervals on. The caller declares the counters of the interval its own
# clock is in (ARGV[8]) and of the one either side; the script takes the one
# Redis's clock says. A caller whose clock is further off gets its counter
# built here (undeclared: fine on one Redis or with Sentinel, as wurk runs).
# KEYS: counters for ARGV[8] - 1, ARGV[8], ARGV[8] + 1, meta, list.
# ARGV: head, limit, interval, the caller's interval number.
BUCKET_ACQUIRE = Script("limiter_bucket_acquire", _check("string", """
local limit = tonumber(ARGV[6])
local raw = redis.call("get", KEYS[1])
local count = 0
if raw then
  count = tonumber(raw)
  if not finite(count) or count ~= math.floor(count) or count < 0 then
    return bad("holds " .. string.sub(raw, 1, 40) .. ", not a count")
  end
end
if count < limit then
  redis.call("incr", KEYS[1])
  redis.call("pexpire", KEYS[1], math.ceil(interval * 2000) + 1000)
  return {1, tostring(count + 1), fmt(now)}
end
return {0, tostring(count), fmt((epoch + 1) * interval - now)}
""", prelude="""
local interval = tonumber(ARGV[7])
local epoch = math.floor(now / interval)
local offset = epoch - tonumber(ARGV[8])
if offset >= -1 and offset <= 1 then
  KEYS[1] = KEYS[offset + 2]
else
  KEYS[1] = string.gsub(KEYS[2], ":[-%d]+$", "") .. ":" .. string.format("%d", epoch)
end
"""))

# Leaky bucket: a level that drains continuously at ARGV[7] per second and
# holds at most ARGV[6]; each admission adds 1. The HASH KEYS[1] keeps
# ``level`` and ``last`` (the time of the level). A refusal still stores the
# drained level, so the hash never holds a level above what it was.
# KEYS: level HASH, meta, list. ARGV: head, capacity, drain rate.
LEAKY_ACQUIRE = Script("limiter_leaky_acquire", _check("hash", """
local capacity, rate = tonumber(ARGV[6]), tonumber(ARGV[7])
local data = redis.call("hmget", KEYS[1], "level", "last")
local level, last = 0, now
if data[1] then
  level, last = tonumber(data[1]), tonumber(data[2] or "")
  if not finite(level) or not finite(last) then
    return bad("holds a level or time that is not a number")
  end
end
level = level - math.max(0, now - last) * rate
if level < 0 then level = 0 end
local ok = level + 1 <= capacity
if ok then level = level + 1 end
redis.call("hset", KEYS[1], "level", string.format("%.17g", level), "last", fmt(now))
redis.call("pexpire", KEYS[1], math.ceil(capacity / rate * 1000) + 1000)
if ok then return {1, fmt(level), fmt(now)} end
return {0, fmt(level), fmt((level + 1 - capacity) / rate)}
"""))

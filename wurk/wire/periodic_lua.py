"""The periodic loop's Lua script: one tick claimed, fenced and recorded in one step.

It lives beside :mod:`wurk.wire.lua` rather than in it only to keep each
file short; it runs through the same :class:`~wurk.wire.lua.Script`.
"""

from __future__ import annotations

from wurk.wire.lua import Script

# Claim one periodic tick, fenced by the leader lease: only while the lease
# key holds this leader's value, the entry is not paused and its mark is
# below the tick. "fire" also takes the tick's guard (SET NX) and records the
# fire ([fired_at, jid] in the capped history); "skip" only moves the mark.
# KEYS: lease, guard, loop hash, loop history.
# ARGV: lease value, tick, guard TTL, mode, jid, fired_at, next fire, cap.
# Returns 1 fired, 2 skipped, 0 not the leader, -1 paused, -2 already done,
# -3 not registered (the hash is gone: a flushed or restarted Redis).
PERIODIC_TICK = Script(
    "periodic_tick",
    """
if redis.call("get", KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call("exists", KEYS[3]) == 0 then return -3 end
if redis.call("hget", KEYS[3], "paused") == "1" then return -1 end
local mark = tonumber(redis.call("hget", KEYS[3], "tick") or "")
if mark and mark >= tonumber(ARGV[2]) then return -2 end
if ARGV[4] == "skip" then
  redis.call("hset", KEYS[3], "tick", ARGV[2], "nf", ARGV[7])
  return 2
end
if not redis.call("set", KEYS[2], ARGV[5], "NX", "EX", ARGV[3]) then return -2 end
redis.call("hset", KEYS[3], "tick", ARGV[2], "lf", ARGV[6], "nf", ARGV[7])
redis.call("lpush", KEYS[4], "[" .. ARGV[6] .. "," .. cjson.encode(ARGV[5]) .. "]")
redis.call("ltrim", KEYS[4], 0, tonumber(ARGV[8]) - 1)
return 1
""",
)

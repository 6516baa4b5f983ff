"""The scripts that give a process's private lists back, and that blame.

RECOVER and ACCUSE share their keys, arguments and the blame prelude
(``_BLAME``); reliable fetch's CLAIM (``wurk.wire.lua``) is what runs the
suspects they mark alone. Like the other draining moves, RECOVER starts with
a write that frees (a pop), so it works at maxmemory (see ``wurk.wire.lua``).
"""

from __future__ import annotations

from wurk.wire.lua import Script

# Blame, shared by RECOVER and ACCUSE (same KEYS and ARGV). Only the one job
# a crashed process held is blamed (``blamed``), and only if it is still the
# job the caller read and built the dead entry for: its poison-pill counter
# goes up, and past max recoveries it is buried (``bury``: the dead set, with
# the caller's entry saying how it crashed). Jobs that crashed beside others
# become suspects (``suspect``): CLAIM runs each alone, so a crash while it
# runs is its own. Marks older than the suspect TTL fade (``fade``).
# KEYS: owners set, the identity's wip-queues set, dead set, queues set,
#       suspects set.
# ARGV: identity, private-list prefix, cause ("released", "none" or
#       "crashed"), max recoveries, pill TTL, now (score), dead cutoff score,
#       dead max jobs, suspect TTL, then the lone job's raw payload, pill key,
#       dead entry, unique lock key and jid (each "" when none).
_BLAME = """
local now, lone, pill, entry, lock = ARGV[6], ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local function held_jobs(queues)
  local held = 0
  for _, q in ipairs(queues) do held = held + redis.call("llen", ARGV[2] .. q) end
  return held
end
local function blamed(job, held)
  if held ~= 1 or pill == "" or job ~= lone then return false end
  local count = redis.call("incr", pill)
  redis.call("expire", pill, ARGV[5])
  return count > tonumber(ARGV[4])
end
local function bury()
  redis.call("zrem", KEYS[5], lone)
  redis.call("zadd", KEYS[3], now, entry)
  redis.call("zremrangebyscore", KEYS[3], "-inf", ARGV[7])
  redis.call("zremrangebyrank", KEYS[3], 0, -tonumber(ARGV[8]))
  -- Its end frees its unique lock, if the lock still holds its jid. (Limiter
  -- slots, batch and workflow counts would be released here too.)
  if lock ~= "" and redis.call("get", lock) == ARGV[14] then redis.call("del", lock) end
end
local function suspect(job) redis.call("zadd", KEYS[5], now, job) end
local function fade()
  redis.call("zremrangebyscore", KEYS[5], "-inf", tonumber(now) - tonumber(ARGV[9]))
  redis.call("expire", KEYS[5], ARGV[9])
end
"""

# Recover a process's private lists (see _BLAME for KEYS and ARGV). Every
# job goes back to the fetch end of its queue (newest popped first, so the
# oldest ends nearest the fetch end), except a lone crasher past its max
# recoveries, which is buried. Only a "crashed" cause makes suspects and
# blames: a process released at its stop, or dead with no evidence against
# its jobs (a SIGKILL, a lapsed heartbeat), gives them back unblamed and
# unsuspected, to run again at once.
# Reply: {requeued, killed}.
RECOVER = Script(
    "recover",
    _BLAME + """
local queues = redis.call("smembers", KEYS[2])
local crashed = ARGV[3] == "crashed"
local held = crashed and held_jobs(queues) or 0
local recovered, killed = 0, 0
for _, q in ipairs(queues) do
  local wip = ARGV[2] .. q
  local job = redis.call("lpop", wip)
  while job do
    if crashed and blamed(job, held) then
      bury()
      killed = killed + 1
    else
      redis.call("sadd", KEYS[4], q)
      redis.call("rpush", "queue:" .. q, job)
      if crashed then suspect(job) end
      recovered = recovered + 1
    end
    job = redis.call("lpop", wip)
  end
end
if crashed and recovered > 0 then fade() end
redis.call("del", KEYS[2])
redis.call("srem", KEYS[1], ARGV[1])
return {recovered, killed}
""",
)

# Accuse a live process's running jobs (the swarm parent recycles it for its
# memory; see _BLAME for KEYS and ARGV): each becomes a suspect, and a lone
# one is blamed. One buried leaves the private list, so its run's own settle
# or its stop's give-back finds nothing to write.
# Reply: {marked as suspects, killed}.
ACCUSE = Script(
    "accuse",
    _BLAME + """
local queues = redis.call("smembers", KEYS[2])
local held = held_jobs(queues)
local marked, killed = 0, 0
for _, q in ipairs(queues) do
  for _, job in ipairs(redis.call("lrange", ARGV[2] .. q, 0, -1)) do
    if blamed(job, held) then
      redis.call("lrem", ARGV[2] .. q, -1, job)
      bury()
      killed = killed + 1
    else
      suspect(job)
      marked = marked + 1
    end
  end
end
if marked > 0 then fade() end
return {marked, killed}
""",
)

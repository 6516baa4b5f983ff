"""Lua scripts run by SHA, with a NOSCRIPT fallback that loads and retries.

Each multi-step atomic operation is a named script here, so reviewing what
runs inside Redis means reading one file.

At maxmemory (``noeviction``) Redis refuses every command that may grow
memory, but inside a script only until the script has written something,
even a write that changed nothing (tested on Redis 7.0.15; 6.2's scripting
has the same rule, while ``#!lua flags=allow-oom`` is 7.0+ only). The moves
a draining worker needs (claim, acknowledge, settle, requeue, recover, the
heartbeat) therefore start with a write that frees: a pop or a removal, made
before any push or add, so they keep working when Redis is full.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as rx

from wurk.redis.connection import Conn


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


# Reliable fetch, one round trip: first settle acknowledgements (remove each
# finished job from its private list, retire its poison-pill counter and its
# suspect mark), then move up to ``want`` jobs from the queues, in the order
# given, skipping paused ones, into this process's private lists.
# A suspect (a job that was running when its process crashed, see
# wurk.wire.recover_lua) runs alone, so a crash while it runs is its own: it
# is taken only by a process whose private lists are otherwise empty, and
# nothing is claimed beside it. A
# suspect at the head of a queue stops a busy process's claim there.
# A job that BRPOPLPUSH already moved ("landed") is checked the same way
# first: kept, or, if it is a suspect and we hold others, pushed back to the
# fetch end of its queue.
# The suspects key is looked at once per call; without it the claim pays
# nothing more. Each move pops before it pushes and registers the owner only
# after its first pop, so a claim works at maxmemory (see the module
# docstring).
# KEYS: paused set, owners set, the identity's wip-queues set, suspects set,
#       then per queue its queue list and private list.
# ARGV: identity, want, queue count n, n queue names, landed job's queue
#       position (0: none), landed payload, then ack triples (private list,
#       raw payload, pill key or "").
# Reply: a status (0; 1: the one job claimed is a suspect; 2: a suspect waits
#        for this process to hold nothing), then (queue name, payload) pairs.
CLAIM = Script(
    "claim",
    """
local identity, want, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local landed_at, landed = tonumber(ARGV[4 + n]), ARGV[5 + n]
local suspects = redis.call("exists", KEYS[4]) == 1
for i = 6 + n, #ARGV, 3 do
  redis.call("lrem", ARGV[i], -1, ARGV[i + 1])
  if ARGV[i + 2] ~= "" then redis.call("del", ARGV[i + 2]) end
  if suspects then redis.call("zrem", KEYS[4], ARGV[i + 1]) end
end
local out = {0}
if want <= 0 and landed_at == 0 then return out end
local function suspect(job)
  return suspects and redis.call("zscore", KEYS[4], job) ~= false
end
local function held()
  local total = 0
  for q = 1, n do total = total + redis.call("llen", KEYS[4 + 2 * q]) end
  return total
end
if landed_at > 0 then
  local name = ARGV[3 + landed_at]
  if suspect(landed) then
    local dst = KEYS[4 + 2 * landed_at]
    local mine = redis.call("lrem", dst, -1, landed) > 0
    if mine and held() == 0 then
      redis.call("lpush", dst, landed)
      return {1, name, landed}
    end
    if mine then redis.call("rpush", KEYS[3 + 2 * landed_at], landed) end
    return {2}
  end
  out[2], out[3] = name, landed
  want = want - 1
end
local registered = {}
local function move(src, dst, name)
  local job = redis.call("rpop", src)
  if not job then return nil end
  redis.call("lpush", dst, job)
  if not registered[name] then
    if next(registered) == nil then redis.call("sadd", KEYS[2], identity) end
    redis.call("sadd", KEYS[3], name)
    registered[name] = true
  end
  return job
end
for q = 1, n do
  local name = ARGV[3 + q]
  if want > 0 and redis.call("sismember", KEYS[1], name) == 0 then
    local src, dst = KEYS[3 + 2 * q], KEYS[4 + 2 * q]
    while want > 0 do
      local head = suspects and redis.call("lindex", src, -1)
      if head and suspect(head) then
        if #out > 1 or held() > 0 then
          out[1] = 2
          return out
        end
        move(src, dst, name)
        return {1, name, head}
      end
      local job = move(src, dst, name)
      if not job then break end
      out[#out + 1] = name
      out[#out + 1] = job
      want = want - 1
    end
  end
end
return out
""",
)

# One heartbeat: pop one remote signal (first, so that the writes after it
# are allowed at maxmemory), register in ``processes`` and write the
# identity hash with its TTL. The same keys as Sidekiq's MULTI block.
# KEYS: processes set, identity hash, signals list.
# ARGV: identity, TTL, then the hash's field/value pairs.
BEAT = Script(
    "beat",
    """
local signal = redis.call("rpop", KEYS[3])
redis.call("sadd", KEYS[1], ARGV[1])
redis.call("hset", KEYS[2], unpack(ARGV, 3))
redis.call("expire", KEYS[2], ARGV[2])
return signal
""",
)

# Give jobs back: for each (private list, queue list, raw) remove the job from
# the private list and, only if it was there, push it to the oldest end of its
# queue. A job already acknowledged or recovered is not pushed twice.
REQUEUE = Script(
    "requeue",
    """
local moved = 0
for i = 1, #ARGV, 3 do
  if redis.call("lrem", ARGV[i], -1, ARGV[i + 2]) > 0 then
    redis.call("rpush", ARGV[i + 1], ARGV[i + 2])
    moved = moved + 1
  end
end
return moved
""",
)

# Settle a failed job in one step: remove the copy this run claimed from its
# private list and, only if it was still there, write where the job goes
# next (its retry entry, or its dead entry with Sidekiq's age and size trims)
# and retire its poison-pill counter and its suspect mark (see RECOVER). A
# copy a stop or a recovery gave back, or a replay of a settle that landed,
# writes nothing, unless the job's claim epoch is gone (wurk.wire.epoch): its
# copy went with Redis's data, so the entry is written, once (the marker), and
# the reply is 2. With no private list (basic fetch) it is just the write.
# The removal comes first also because it counts as the script's first write,
# which lets it go on writing at maxmemory.
# KEYS: the retry or dead set, the suspects set, the epoch key.
# ARGV: private list or "", claimed payload, pill key or "", mode, score,
#       entry, dead cutoff, dead max jobs, claim epoch or "", marker, its TTL.
SETTLE = Script(
    "settle",
    """
local gone = ARGV[1] ~= "" and redis.call("lrem", ARGV[1], -1, ARGV[2]) == 0
if gone and (ARGV[9] == "" or redis.pcall("get", KEYS[3]) == ARGV[9]
             or not redis.call("set", ARGV[10], 1, "NX", "EX", ARGV[11])) then return 0 end
local mode = ARGV[4]
if mode ~= "drop" then redis.call("zadd", KEYS[1], ARGV[5], ARGV[6]) end
if mode == "dead" then
  redis.call("zremrangebyscore", KEYS[1], "-inf", ARGV[7])
  redis.call("zremrangebyrank", KEYS[1], 0, -tonumber(ARGV[8]))
end
if ARGV[3] ~= "" then redis.call("del", ARGV[3]) end
redis.call("zrem", KEYS[2], ARGV[2])
return gone and 2 or 1
""",
)

# The reliable scheduler's move: for each (member, queue, payload) remove the
# member from the sorted set and, only if this call removed it, push the new
# payload (or, with an empty queue name, send the member to the dead set).
# Nothing is popped without being pushed in the same step, and two pollers
# racing never push one job twice. Safe to replay for the same reason.
# KEYS: the sorted set, queues set, dead set.
# ARGV: now score, dead cutoff score, dead max jobs, then the triples.
PROMOTE = Script(
    "promote",
    """
local moved = 0
for i = 4, #ARGV, 3 do
  if redis.call("zrem", KEYS[1], ARGV[i]) == 1 then
    if ARGV[i + 1] == "" then
      redis.call("zadd", KEYS[3], ARGV[1], ARGV[i])
      redis.call("zremrangebyscore", KEYS[3], "-inf", ARGV[2])
      redis.call("zremrangebyrank", KEYS[3], 0, -tonumber(ARGV[3]))
    else
      redis.call("sadd", KEYS[2], ARGV[i + 1])
      redis.call("lpush", "queue:" .. ARGV[i + 1], ARGV[i + 2])
      moved = moved + 1
    end
  end
end
return moved
""",
)

# A push that can be sent again without enqueueing anything twice. Each
# logical push carries a nonce; a job goes in unless its jid's marker already
# holds that nonce (then this is a resend of a push that landed). A marker
# with another value, or none, means a new push of that jid (the classic
# poller, a retry from the admin API) and never blocks it. The job is
# written before its marker, so a failed write leaves no marker behind. A
# landed push gets its marker's TTL renewed instead, a write that moves this
# connection's replication offset past the first attempt, so the WAIT that
# follows covers it too. Markers of pushes replicas already confirmed are
# deleted on the way, if they still hold their push's nonce.
# KEYS: queues set, the markers to retire, then per job its marker and its
#       destination (queue list, or the schedule set).
# ARGV: marker TTL, count of markers to retire, this push's nonce, the
#       retired markers' nonces, then per job (queue name, score or "" for
#       now, payload).
PUSH_ONCE = Script(
    "push_once",
    """
local ttl, retire, nonce = ARGV[1], tonumber(ARGV[2]), ARGV[3]
for r = 1, retire do
  if redis.call("get", KEYS[1 + r]) == ARGV[3 + r] then redis.call("del", KEYS[1 + r]) end
end
local pushed, k = 0, 2 + retire
for i = 4 + retire, #ARGV, 3 do
  local marker, dest = KEYS[k], KEYS[k + 1]
  k = k + 2
  if redis.call("get", marker) == nonce then
    redis.call("expire", marker, ttl)
  else
    if ARGV[i + 1] == "" then
      redis.call("sadd", KEYS[1], ARGV[i])
      redis.call("lpush", dest, ARGV[i + 2])
    else
      redis.call("zadd", dest, ARGV[i + 1], ARGV[i + 2])
    end
    redis.call("set", marker, nonce, "EX", ttl)
    pushed = pushed + 1
  end
end
return pushed
""",
)

# Take the locks of unique jobs (wurk.unique.push), Sidekiq Enterprise's
# ``unique:<digest>`` strings holding a jid, for a whole push or bulk batch in
# order, so a duplicate within a batch meets its twin's lock. Granted when the
# key is free or holds the job's own jid (a job pushed again, or this call
# replayed after a lost reply); else the reply is the holder ("" for a key
# that is not a string), and a key without a TTL gets the job's, so nothing
# blocks for ever. KEYS: a lock per job. ARGV: per job, jid and TTL in ms.
UNIQUE_LOCK = Script(
    "unique_lock",
    """
local out = {}
for i = 1, #KEYS do
  local key, jid, ttl = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call("set", key, jid, "NX", "PX", ttl) then
    out[i] = 1
  else
    local holder = ""
    if redis.call("type", key).ok == "string" then holder = redis.call("get", key) end
    if holder == jid then
      out[i] = 1
    else
      if redis.call("pttl", key) == -1 then redis.call("pexpire", key, ttl) end
      out[i] = holder
    end
  end
end
return out
""",
)

# Release unique jobs' locks, each only if it still holds its job's jid (a
# duplicate may hold a key after ours expired). KEYS: locks. ARGV: their jids.
UNIQUE_RELEASE = Script(
    "unique_release",
    """
local released = 0
for i = 1, #KEYS do
  if redis.call("type", KEYS[i]).ok == "string" and redis.call("get", KEYS[i]) == ARGV[i] then
    released = released + redis.call("del", KEYS[i])
  end
end
return released
""",
)

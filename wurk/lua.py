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


# Reliable fetch, one round trip: first settle acknowledgements (remove each
# finished job from its private list and retire its poison-pill counter),
# then move up to ``want`` jobs from the queues, in the order given, skipping
# paused ones, into this process's private lists. Each move pops before it
# pushes and registers the owner only after its first pop, so a claim works
# at maxmemory (see the module docstring).
# KEYS: paused set, owners set, the identity's wip-queues set, then per queue
#       its queue list and private list.
# ARGV: identity, want, queue count n, n queue names, then ack triples
#       (private list, raw payload, pill key or "").
CLAIM = Script(
    "claim",
    """
local identity, want, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local i = 4 + n
while i <= #ARGV do
  redis.call("lrem", ARGV[i], -1, ARGV[i + 1])
  if ARGV[i + 2] ~= "" then redis.call("del", ARGV[i + 2]) end
  i = i + 3
end
local out = {}
if want <= 0 then return out end
for q = 1, n do
  local name = ARGV[3 + q]
  if redis.call("sismember", KEYS[1], name) == 0 then
    local src, dst = KEYS[2 + 2 * q], KEYS[3 + 2 * q]
    local job = redis.call("rpop", src)
    if job then
      redis.call("sadd", KEYS[2], identity)
      redis.call("sadd", KEYS[3], name)
    end
    while job do
      redis.call("lpush", dst, job)
      out[#out + 1] = name
      out[#out + 1] = job
      want = want - 1
      if want == 0 then return out end
      job = redis.call("rpop", src)
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
# and retire its poison-pill counter. A copy that a stop already gave back,
# or a replay of a settle that landed, finds nothing and writes nothing. With
# no private list (basic fetch) it is just the write. The removal comes
# first for a second reason: it counts as the script's first write, and
# Redis lets a script that has written go on writing at maxmemory.
# KEYS: the retry or dead set.
# ARGV: private list or "", claimed payload, pill key or "", mode ("retry",
#       "dead" or "drop"), score, entry, dead cutoff score, dead max jobs.
SETTLE = Script(
    "settle",
    """
if ARGV[1] ~= "" and redis.call("lrem", ARGV[1], -1, ARGV[2]) == 0 then return 0 end
local mode = ARGV[4]
if mode ~= "drop" then redis.call("zadd", KEYS[1], ARGV[5], ARGV[6]) end
if mode == "dead" then
  redis.call("zremrangebyscore", KEYS[1], "-inf", ARGV[7])
  redis.call("zremrangebyrank", KEYS[1], 0, -tonumber(ARGV[8]))
end
if ARGV[3] ~= "" then redis.call("del", ARGV[3]) end
return 1
""",
)

# Recover a dead process's private lists. Each job's poison-pill counter goes
# up; a job recovered more than ARGV[3] times goes to the dead set instead of
# back to its queue. Newest first, so the oldest ends nearest the fetch end.
# KEYS: owners set, the identity's wip-queues set, dead set, queues set.
# ARGV: identity, private-list prefix, max recoveries, pill prefix, pill TTL,
#       now (score), dead cutoff score, dead max jobs.
RECOVER = Script(
    "recover",
    """
local recovered, killed = 0, 0
for _, q in ipairs(redis.call("smembers", KEYS[2])) do
  local wip = ARGV[2] .. q
  local job = redis.call("lpop", wip)
  while job do
    local ok, decoded = pcall(cjson.decode, job)
    local jid = ok and type(decoded) == "table" and decoded["jid"]
    local count = 0
    if type(jid) == "string" then
      count = redis.call("incr", ARGV[4] .. jid)
      redis.call("expire", ARGV[4] .. jid, ARGV[5])
    end
    if count > tonumber(ARGV[3]) then
      redis.call("zadd", KEYS[3], ARGV[6], job)
      redis.call("zremrangebyscore", KEYS[3], "-inf", ARGV[7])
      redis.call("zremrangebyrank", KEYS[3], 0, -tonumber(ARGV[8]))
      killed = killed + 1
    else
      redis.call("sadd", KEYS[4], q)
      redis.call("rpush", "queue:" .. q, job)
      recovered = recovered + 1
    end
    job = redis.call("lpop", wip)
  end
end
redis.call("del", KEYS[2])
redis.call("srem", KEYS[1], ARGV[1])
return {recovered, killed}
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

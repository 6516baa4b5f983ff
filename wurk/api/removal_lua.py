"""The scripts that remove jobs a person deletes or kills, with what they hold.

A job that leaves a queue or set by hand never runs again, so whatever it
holds must go with it, in the same script: its unique lock (only while it
still holds the job's jid), its count in its batch (a failure that ends it:
``job_failed`` of :mod:`wurk.batches.failure_lua`, so ``death`` and
``complete`` fire as they are due), and its result waiters' final record.

Duties:
1. :data:`REMOVE`: for each member given (a chunk, at most a few hundred),
   LREM/ZREM it, and only if this call removed it: move it to ``dead``
   (a kill), drop its dead note (removed from ``dead``) and its poison-pill
   marks (a suspect mark, a crash counter: ``wurk.wire.recover_lua``),
   release its lock, record its end in its batch and store its result. A replay finds the
   members gone and does nothing again. The first write is a removal, so
   the script runs at maxmemory (see :mod:`wurk.wire.lua`). The jobs of a
   spool file a person discards end the same way, unless their push landed
   after all (its push marker says so); their first write is that marker.
2. :data:`TAKE`: the start of a clear: rename the queue or set to a private
   key (a snapshot: what is pushed after is not cleared), note where it came
   from in ``wurk:clearing``, and forget a queue's name, as Sidekiq's clear
   does. A replay finds the private key taken and changes nothing.

The Python side that plans each member and walks the chunks is
:mod:`wurk.api.removal`. The scripts sit with it, above the features whose
holdings they free (a batch's failure script is part of this one), rather
than in ``wurk.wire`` below them.
"""

from __future__ import annotations

from wurk.batches.lua import batch_script
from wurk.wire.lua import Script

# ARGV: source type ("list", "zset" or "spool"), source key, mode ("delete"
# or "kill"), dead key, now score, dead age cutoff score, dead max size, notes
# hash and notes-at set ("" unless the source is the dead set), the suspects
# set, the poison-pill key prefix and the push markers' TTL; then GROUP
# values per member: member, lock key, jid, bid, batch info JSON, result key,
# ready key, result record, result TTL ("" where the job has none of these).
# For "spool" (the jobs of a spool file being discarded, which never reached
# a queue) the source key is the push markers' prefix and each member is the
# nonce of the job's push: a job whose push landed has a marker (and sits in
# its queue, holding what it took), so it is left; one without is ended, and
# marked, so its push, or this call replayed, finds it done. A marker lives
# keys.PUSHED_TTL: past it, a job whose push landed and that already ran
# keeps the result record it wrote.
# Replies a list: 1 for each member this call removed (or ended), else 0.
HEAD = 12
GROUP = 9
REMOVE = batch_script("removal", """
local kind, from, mode, dead = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local notes, notes_at, suspects, pills = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
-- checked before the first write: a wrong type must not stop a chunk halfway
local function is(key, want)
  local ty = redis.call("type", key).ok
  return ty == want or ty == "none"
end
if mode == "kill" and not is(dead, "zset") then
  return redis.error_reply("WURKREMOVE " .. dead .. " is not a sorted set: nothing was moved")
end
if notes ~= "" and not (is(notes, "hash") and is(notes_at, "zset")) then notes = "" end
if not is(suspects, "zset") then suspects = "" end
-- A recovered job's poison-pill marks end with it: its suspect mark (its
-- payload, as the reaper wrote it) and its crash counter.
local function unmarked(member, jid)
  if suspects ~= "" then redis.call("zrem", suspects, member) end
  if jid ~= "" and pills ~= "" then redis.call("del", pills .. jid) end
end
local function ended(lock, jid, bid, info, rkey, ready, record, ttl)
  if lock ~= "" and redis.call("type", lock).ok == "string"
      and redis.call("get", lock) == jid then
    redis.call("del", lock)
  end
  if bid ~= "" and not insane(bid, WORKER_KEYS) then job_failed(bid, jid, info, "1") end
  -- A spooled job with a record ran after all (its push landed, its marker
  -- since expired): its own record stands.
  if record ~= "" and kind == "spool" and redis.call("exists", rkey) == 1 then record = "" end
  if record ~= "" then  -- as result_store writes a final record
    redis.call("del", ready)
    redis.call("set", rkey, record, "EX", ttl)
    redis.call("rpush", ready, "1")
    redis.call("expire", ready, ttl)
  end
end
local function taken(member, jid)
  if kind == "list" then return redis.call("lrem", from, 1, member) end
  if kind == "zset" then return redis.call("zrem", from, member) end
  if jid == "" then return 0 end
  if redis.call("set", from .. jid, member, "NX", "EX", ARGV[12]) then return 1 end
  return 0
end
local done, moved = {}, 0
for i = %(head)d + 1, #ARGV, %(group)d do
  local member = ARGV[i]
  local removed = taken(member, ARGV[i + 2])
  done[#done + 1] = removed
  if removed == 1 then
    if notes ~= "" then
      local digest = redis.sha1hex(member)
      redis.call("hdel", notes, digest)
      redis.call("zrem", notes_at, digest)
    end
    if mode == "kill" then
      redis.call("zadd", dead, ARGV[5], member)
      moved = moved + 1
    end
    if kind ~= "spool" then unmarked(member, ARGV[i + 2]) end
    ended(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6],
          ARGV[i + 7], ARGV[i + 8])
  end
end
if moved > 0 then  -- Sidekiq's DeadSet#kill: trim by age, then by size
  redis.call("zremrangebyscore", dead, "-inf", ARGV[6])
  redis.call("zremrangebyrank", dead, 0, -tonumber(ARGV[7]))
end
return done
""" % {"head": HEAD, "group": GROUP})  # noqa: UP031 - the Lua source is full of braces

# KEYS: source, private key, the clearing index, the queues set (a queue only).
# ARGV: the queue's name ("" for a set), the private key's TTL.
# Replies how many entries were taken, -1 for a replay (the private key exists).
TAKE = Script("clear_take", """
if redis.call("hexists", KEYS[3], KEYS[2]) == 1 then return -1 end
local size = 0
local kind = redis.call("type", KEYS[1]).ok
if kind == "list" then size = redis.call("llen", KEYS[1])
elseif kind == "zset" then size = redis.call("zcard", KEYS[1]) end
if size > 0 then
  redis.call("rename", KEYS[1], KEYS[2])
  redis.call("expire", KEYS[2], ARGV[2])
  redis.call("hset", KEYS[3], KEYS[2], KEYS[1])
end
if ARGV[1] ~= "" then redis.call("srem", KEYS[4], ARGV[1]) end
return size
""")

"""The batches' Lua scripts: every change to a batch is one atomic script.

Duties:
1. ``batch_create``/``batch_hold``/``batch_remove``/``batch_abort``: the
   builder's side: the record, its holds, uncounting, an aborted block.
2. ``batch_add``: count jobs in before they are pushed (the buffered and
   confirmed write paths; a plain write counts and pushes in one script,
   :mod:`wurk.batches.push_lua`).
3. ``batch_succeeded``/``batch_failed``: the worker's side: count a job out,
   record a failure or a death (the step :mod:`wurk.batches.failure_lua`
   shares with a person's removal of a job).
4. ``settle`` (in every script that can finish a batch): fire what is due,
   exactly once, and walk up to the parent.

Each script that can finish a batch ends in the shared ``settle`` step, so
the call that makes a batch complete (or successful) is the same call that
records it fired (a ``SET NX`` marker, ``b-<bid>-complete``/``-success``/
``-death``) and pushes its callback jobs: exactly one caller fires each
event, however many finish at once, and a replay (a lost reply, a job run
twice after reliable-fetch recovery) finds the marker and pushes nothing.

The rules, for a batch B:
- ``complete`` fires when every pending member of ``b-B-jids`` has failed
  at least once (``b-B-failed``), no builder holds B open, and no child is
  incomplete (``b-B-pkids`` empty): every job ran once.
- ``success`` fires when ``b-B-jids`` and ``b-B-ukids`` are both empty.
- ``death`` fires on the first death in B, and in each of its ancestors.
- A child's firing removes it from its parent's ``pkids``/``ukids`` and
  settles the parent in the same call, up the chain. A callback of a child
  is pushed as a job of the parent (``bid`` = parent, counted there), so a
  parent stays open while its children's callbacks run and may add jobs.

Keys are built in the scripts from the bid (``b-<bid>...``), as Sidekiq
Pro's are, so the scripts need a single Redis, not a cluster. State that is
not what these scripts write (a wrong-type key) is refused before anything
is written, with an error reply starting ``WURKBATCH``.
"""

from __future__ import annotations

from wurk.batches import keys as batch
from wurk.batches.failure_lua import FAILURE_STEP
from wurk.wire import keys
from wurk.wire.lua import Script

_PRELUDE = """
local QUEUES, QPREFIX, INDEX = "%(queues)s", "%(qprefix)s", "%(index)s"
local RETIRE, RETIRE_DRAIN = "%(retire)s", %(retire_drain)d
local MARKER_TTL, MARKER_MARGIN_MS, LINGER = %(marker_ttl)d, %(marker_margin)d, %(linger)d
local SUFFIXES = {%(suffixes)s}
local TYPES = {jids = "set", failed = "set", failinfo = "hash", died = "set", kids = "set",
               pkids = "set", ukids = "set", complete = "string", success = "string",
               death = "string"}
local t = redis.call("time")
local stamp = t[1] .. "." .. string.rep("0", 6 - #t[2]) .. t[2]

local function k(bid, suffix)
  if suffix then return "b-" .. bid .. "-" .. suffix end
  return "b-" .. bid
end

local function int(v)
  local x = tonumber(v)
  if not x or x ~= x or x > 1e15 or x < -1e15 then return "0" end
  return string.format("%%d", x)
end

-- nil when the batch's keys (or the hash and ONLY's) have the types these scripts give them
local function insane(bid, only)
  local ty = redis.call("type", k(bid))["ok"]
  if ty ~= "hash" and ty ~= "none" then return "WURKBATCH " .. k(bid) .. " is a " .. ty end
  for _, s in ipairs(only or SUFFIXES) do
    ty = redis.call("type", k(bid, s))["ok"]
    if ty ~= TYPES[s] and ty ~= "none" then
      return "WURKBATCH " .. k(bid, s) .. " is a " .. ty
    end
  end
  return nil
end

-- CMD KEY with the items FROM..TO of LIST, a thousand per call (under Lua's stack limit)
local function each(cmd, key, list, from, to)
  local done = 0
  for i = from, to, 1000 do
    done = done + redis.call(cmd, key, unpack(list, i, math.min(i + 999, to)))
  end
  return done
end

-- count JIDS into BID (already checked): how many were new
local function count(bid, jids)
  local added = each("sadd", k(bid, "jids"), jids, 1, #jids)
  if added > 0 then
    redis.call("hincrby", k(bid), "total", added); redis.call("hincrby", k(bid), "pending", added)
  end
  redis.call("hset", k(bid), "updated_at", stamp)
  return added
end

-- give a set of the batch the hash's remaining time to live
local function keep(bid, key)
  local ttl = redis.call("ttl", k(bid))
  if ttl > 0 then redis.call("expire", key, ttl) end
end

local function status(bid, event)
  local h = k(bid)
  local f = redis.call("hmget", h, "total", "pending", "created_at", "description",
                       "parent_bid", "workflow")
  local workflow = "null"
  if type(f[6]) == "string" and pcall(cjson.decode, f[6]) then workflow = f[6] end
  local function str(v) if type(v) == "string" and v ~= "" then return cjson.encode(v) end
                        return "null" end
  local created = tonumber(f[3]) or 0
  if created ~= created or created > 1e12 or created < 0 then created = 0 end
  return "{\\"bid\\":" .. cjson.encode(bid) .. ",\\"event\\":\\"" .. event ..
    "\\",\\"total\\":" .. int(f[1]) .. ",\\"pending\\":" .. int(f[2]) ..
    ",\\"failures\\":" .. redis.call("scard", k(bid, "failed")) ..
    ",\\"dead\\":" .. redis.call("scard", k(bid, "died")) ..
    ",\\"created_at\\":" .. string.format("%%.6f", created) ..
    ",\\"description\\":" .. str(f[4]) .. ",\\"parent_bid\\":" .. str(f[5]) ..
    ",\\"workflow\\":" .. workflow .. "}"
end

-- push the callback jobs of one event; each template is {queue, head, tail, jid, bid, ts}
local function push_callbacks(bid, event)
  local raw = redis.call("hget", k(bid), "cbt")
  if type(raw) ~= "string" then return 0 end
  local ok, all = pcall(cjson.decode, raw)
  if not ok or type(all) ~= "table" or type(all[event]) ~= "table" then return 0 end
  local st, pushed = nil, 0
  for _, cb in ipairs(all[event]) do
    if type(cb) == "table" and type(cb[1]) == "string" and type(cb[2]) == "string"
        and type(cb[3]) == "string" and type(cb[4]) == "string" and #cb[3] > 0 then
      st = st or status(bid, event)
      local at = stamp
      if cb[6] == "ms" then at = t[1] .. string.sub(stamp, -6, -4) end
      local payload = cb[2] .. st .. string.sub(cb[3], 1, -2) ..
                      ",\\"enqueued_at\\":" .. at .. "}"
      local parent = cb[5]
      if type(parent) == "string" and parent ~= "" and redis.call("exists", k(parent)) == 1
          and redis.call("type", k(parent, "jids"))["ok"] ~= "string" then
        if redis.call("sadd", k(parent, "jids"), cb[4]) == 1 then
          redis.call("hincrby", k(parent), "total", 1)
          redis.call("hincrby", k(parent), "pending", 1)
        end
      end
      redis.call("sadd", QUEUES, cb[1])
      redis.call("lpush", QPREFIX .. cb[1], payload)
      pushed = pushed + 1
    end
  end
  return pushed
end

-- the marker's TTL in ms: the hash's own, and a margin, so it never goes first
local function marker_ms(bid)
  local left = redis.call("pttl", k(bid))
  if left > 0 then return left + MARKER_MARGIN_MS end
  return MARKER_TTL * 1000
end

-- record EVENT fired for BID (once) and push its callbacks; true when this call fired it
local function fire(bid, event)
  if not redis.call("set", k(bid, event), stamp, "NX", "PX", marker_ms(bid)) then return false end
  redis.call("hset", k(bid), event .. "_at", stamp)
  push_callbacks(bid, event)
  return true
end

local function parent_of(bid)
  local p = redis.call("hget", k(bid), "parent_bid")
  if type(p) == "string" and p ~= "" and p ~= bid and redis.call("exists", k(p)) == 1
      and not insane(p) then
    return p
  end
  return nil
end

-- success fired: every key goes after its linger (markers last), and its index entry
local function linger(bid)
  local keep = tonumber(redis.call("hget", k(bid), "%(linger_field)s"))
  if not keep or keep ~= math.floor(keep) or keep < 1 or keep > LINGER * 90 then keep = LINGER end
  redis.call("expire", k(bid), keep)
  for _, s in ipairs(SUFFIXES) do
    if s ~= "complete" and s ~= "success" and s ~= "death" then
      redis.call("expire", k(bid, s), keep)
    else
      redis.call("pexpire", k(bid, s), keep * 1000 + MARKER_MARGIN_MS)
    end
  end
  redis.call("zadd", RETIRE, tonumber(t[1]) + keep, bid)
end

-- unindex up to RETIRE_DRAIN batches due to be gone (one whose hash lives: look again later)
local function retire()
  local due = redis.call("zrangebyscore", RETIRE, "-inf", t[1], "LIMIT", 0, RETIRE_DRAIN)
  for _, bid in ipairs(due) do
    local left = redis.call("ttl", k(bid))
    if left == -2 then
      redis.call("zrem", INDEX, bid); redis.call("zrem", RETIRE, bid)
    else
      if left < 0 then left = LINGER end
      redis.call("zadd", RETIRE, tonumber(t[1]) + left, bid)
    end
  end
end

-- fire what BID has reached, then walk up while a firing changed a parent
local WORKER_KEYS = {"jids", "failed", "failinfo", "died", "pkids", "ukids"}

local function settle(bid)
  for _ = 1, 64 do
    if redis.call("exists", k(bid)) == 0 then return end
    local live = redis.call("scard", k(bid, "jids"))
    local complete = live == redis.call("scard", k(bid, "failed"))
                     and redis.call("scard", k(bid, "pkids")) == 0 and fire(bid, "complete")
    local success = live == 0 and redis.call("scard", k(bid, "ukids")) == 0
                    and fire(bid, "success")
    if not complete and not success then return end
    -- looked up only when something fired: the common call stops above
    local parent = parent_of(bid)
    if success then linger(bid) end
    if not parent then return end
    if complete then redis.call("srem", k(parent, "pkids"), bid) end
    if success then redis.call("srem", k(parent, "ukids"), bid) end
    bid = parent
  end
end

local function death(bid)
  for _ = 1, 64 do
    if not fire(bid, "death") then return end
    bid = parent_of(bid)
    if not bid then return end
  end
end
-- make batch BID (child of PARENT unless ""), held by HOLD unless "": nil, or the
-- refusal (nothing written); an existing batch still held by HOLD is a replay
local function create(bid, parent, hold, ttl, prune, fields)
  local bad = insane(bid)
  if bad then return bad end
  if redis.call("exists", k(bid)) == 1 then
    if hold ~= "" and redis.call("sismember", k(bid, "jids"), hold) == 1 then return nil end
    return "WURKBATCH batch " .. bid .. " already exists"
  end
  if parent ~= "" then
    bad = insane(parent)
    if bad then return bad end
    if redis.call("exists", k(parent)) == 0 then
      return "WURKBATCH parent batch " .. parent .. " does not exist (expired?)"
    end
    if redis.call("exists", k(parent, "success")) == 1 then
      return "WURKBATCH parent batch " .. parent .. " already succeeded"
    end
    local pttl = redis.call("ttl", k(parent))
    for _, s in ipairs({"kids", "pkids", "ukids"}) do
      redis.call("sadd", k(parent, s), bid)
      if pttl > 0 then redis.call("expire", k(parent, s), pttl) end
    end
    redis.call("hincrby", k(parent), "kids", 1)
    redis.call("hset", k(parent), "updated_at", stamp)
  end
  redis.call("hset", k(bid), "created_at", stamp, "updated_at", stamp, "total", 0, "pending", 0,
             "failures", 0, "kids", 0, "parent_bid", parent, unpack(fields))
  if hold ~= "" then redis.call("sadd", k(bid, "jids"), hold) end
  redis.call("expire", k(bid), ttl)
  redis.call("expire", k(bid, "jids"), ttl)
  redis.call("zremrangebyscore", INDEX, "-inf", "(" .. prune)
  redis.call("zadd", INDEX, stamp, bid)
  redis.call("zadd", RETIRE, tonumber(t[1]) + ttl, bid)
  retire()
  return nil
end
""" % {  # noqa: UP031 - the Lua source is full of braces
    "queues": keys.QUEUES, "qprefix": keys.queue(""), "index": batch.INDEX,
    "marker_ttl": batch.MARKER_TTL, "linger": batch.LINGER, "retire": batch.RETIRE,
    "retire_drain": batch.RETIRE_DRAIN, "marker_margin": batch.MARKER_MARGIN_MS,
    "linger_field": batch.LINGER_FIELD,
    "suffixes": ", ".join(f'"{s}"' for s in batch.SUFFIXES),
} + FAILURE_STEP


def batch_script(name: str, body: str) -> Script:
    """A script with the batch prelude (key names, ``create``, ``settle``) in front."""
    return Script(name, _PRELUDE + body)


_script = batch_script


# Create a batch held open by one builder.
# ARGV = [bid, parent ("" for none), hold member, expires_in, index prune score,
#         field, value, ...]. Replies "ok", or an error naming what is wrong.
CREATE = _script("batch_create", """
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local bad = create(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], fields)
if bad then return redis.error_reply(bad) end
return "ok"
""")

# Count jobs into a batch before they are pushed (the client's built-in step).
# ARGV = [bid, strict ("1": from wurk.Batch), jid, ...]. Replies how many
# were new, or -1 for a batch with no record when not strict (a raw push of
# a payload with someone else's bid goes through uncounted); an error when
# the batch is gone (strict) or already succeeded. A replay counts nothing twice.
ADD = _script("batch_add", """
local bid = ARGV[1]
local bad = insane(bid, {"jids"})
if bad then return redis.error_reply(bad) end
if redis.call("exists", k(bid)) == 0 then
  if ARGV[2] ~= "1" then return -1 end
  return redis.error_reply("WURKBATCH batch " .. bid .. " does not exist (expired or never made)")
end
if redis.call("exists", k(bid, "success")) == 1 then
  return redis.error_reply("WURKBATCH batch " .. bid .. " already succeeded: no jobs can join it")
end
local jids = {}
for i = 3, #ARGV do jids[#jids + 1] = ARGV[i] end
return count(bid, jids)
""")

# Uncount jobs that were counted but not written, or drop a builder's hold.
# ARGV = [bid, member, ...]. Replies how many jobs were uncounted.
REMOVE = _script("batch_remove", """
local bid = ARGV[1]
local bad = insane(bid)
if bad then return redis.error_reply(bad) end
if redis.call("exists", k(bid)) == 0 then return 0 end
local jobs = 0
for i = 2, #ARGV do
  if redis.call("srem", k(bid, "failed"), ARGV[i]) == 1 then  -- keeps -failed within -jids
    redis.call("hincrby", k(bid), "failures", -1)
  end
  if redis.call("srem", k(bid, "jids"), ARGV[i]) == 1
      and string.sub(ARGV[i], 1, %(hold_len)d) ~= "%(hold)s" then
    jobs = jobs + 1
  end
end
if jobs > 0 then
  redis.call("hincrby", k(bid), "total", -jobs)
  redis.call("hincrby", k(bid), "pending", -jobs)
end
redis.call("hset", k(bid), "updated_at", stamp)
settle(bid)
return jobs
""" % {"hold": batch.HOLD_PREFIX, "hold_len": len(batch.HOLD_PREFIX)})  # noqa: UP031

# Take a builder's hold on an existing batch (Batch.reopen used as a context).
# ARGV = [bid, hold member].
HOLD = _script("batch_hold", """
local bid = ARGV[1]
local bad = insane(bid)
if bad then return redis.error_reply(bad) end
if redis.call("exists", k(bid)) == 0 then
  return redis.error_reply("WURKBATCH batch " .. bid .. " does not exist (expired or never made)")
end
if redis.call("exists", k(bid, "success")) == 1 then
  return redis.error_reply("WURKBATCH batch " .. bid .. " already succeeded: no jobs can join it")
end
redis.call("sadd", k(bid, "jids"), ARGV[2])
return 1
""")

# A job of the batch succeeded. ARGV = [bid, jid]. Replies 1 when this call
# counted it, 0 when it was counted before (a second run), -1 when the batch is gone.
SUCCEEDED = _script("batch_succeeded", """
local bid, jid = ARGV[1], ARGV[2]
local bad = insane(bid, WORKER_KEYS)
if bad then return redis.error_reply(bad) end
if redis.call("exists", k(bid)) == 0 then return -1 end
if redis.call("srem", k(bid, "failed"), jid) == 1 then
  redis.call("hincrby", k(bid), "failures", -1)
  redis.call("hdel", k(bid, "failinfo"), jid)
end
redis.call("srem", k(bid, "died"), jid)
local counted = redis.call("srem", k(bid, "jids"), jid)
if counted == 1 then redis.call("hincrby", k(bid), "pending", -1) end
redis.call("hset", k(bid), "updated_at", stamp)
settle(bid)
return counted
""")

# A job of the batch failed. ARGV = [bid, jid, error JSON, "1" if it died].
# Replies 1, 0 when the jid is not pending (it succeeded before), -1 when the batch is gone.
FAILED = _script("batch_failed", """
local bad = insane(ARGV[1], WORKER_KEYS)
if bad then return redis.error_reply(bad) end
return job_failed(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
""")

# A builder's block raised: note why; its hold stays, so no callback fires.
# ARGV = [bid, reason].
ABORT = _script("batch_abort", """
if redis.call("exists", k(ARGV[1])) == 1 and redis.call("type", k(ARGV[1]))["ok"] == "hash" then
  redis.call("hset", k(ARGV[1]), "aborted", ARGV[2], "updated_at", stamp)
end
return 1
""")

"""The scripts that count jobs into a batch and write them in the same call.

A job of a batch must never be written uncounted (it could run and the
batch complete without it), nor counted unwritten (the batch would stay
pending for ever). Sidekiq Pro gets that from one MULTI; here one Lua
script both counts and writes, so whatever happens to the connection
(a lost reply, a killed client), the job and its count land together or
not at all.

Duties:
1. :data:`PUSH`: the client's plain write of jobs of batches: check every
   batch first (a finished batch, or a missing one when strict, refuses
   the whole write with nothing written), then count the jids and write
   the jobs (``SADD queues`` + ``LPUSH``, ``ZADD schedule``).
2. :data:`LAUNCH`: create a batch, count and write its jobs, and settle it,
   once: a guard field (``HSETNX``-like, checked first) makes a replay a
   no-op, so a workflow step's launch is atomic and safe to send again.
3. :func:`write_args`: the argument tail both scripts share, built from
   the jobs to write.

ARGV layout of the write tail (both scripts): ``nqueues, (queue, n,
payload * n) * nqueues, nscheduled, (score, payload) * nscheduled``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wurk.batches.lua import batch_script
from wurk.wire import keys

_WRITE = """
local SCHEDULE = "%(schedule)s"

-- nil when the keys the write tail from index I touches take its writes, else why not:
-- checked before anything is written, since a script's earlier writes are not undone
local function unwritable(i)
  local function wrong(key, want)
    local ty = redis.call("type", key)["ok"]
    if ty ~= want and ty ~= "none" then return "WRONGTYPE " .. key .. " is a " .. ty end
  end
  local bad = wrong(QUEUES, "set")
  local nq = tonumber(ARGV[i]); i = i + 1
  for _ = 1, nq do
    bad = bad or wrong(QPREFIX .. ARGV[i], "list")
    i = i + 2 + tonumber(ARGV[i + 1])
  end
  if tonumber(ARGV[i]) > 0 then bad = bad or wrong(SCHEDULE, "zset") end
  return bad
end

-- write the jobs described by ARGV from index I (the write tail); the next index
local function write(i)
  local nq = tonumber(ARGV[i]); i = i + 1
  for _ = 1, nq do
    local queue, n = ARGV[i], tonumber(ARGV[i + 1]); i = i + 2
    redis.call("sadd", QUEUES, queue)
    each("lpush", QPREFIX .. queue, ARGV, i, i + n - 1)
    i = i + n
  end
  local ns = tonumber(ARGV[i]); i = i + 1
  for _ = 1, ns do
    redis.call("zadd", SCHEDULE, ARGV[i], ARGV[i + 1]); i = i + 2
  end
  return i
end
""" % {"schedule": keys.SCHEDULE}  # noqa: UP031 - the Lua source is full of braces

# ARGV = [strict, nbids, (bid, n, jid * n) * nbids, write tail].
# Replies the bids that have no record (when not strict: written uncounted),
# or an error (WURKBATCH ...) with nothing written.
PUSH = batch_script("batch_push", _WRITE + """
local strict, nb, i = ARGV[1] == "1", tonumber(ARGV[2]), 3
local groups, unknown = {}, {}
for _ = 1, nb do
  local bid, n = ARGV[i], tonumber(ARGV[i + 1])
  local jids = {}
  for j = i + 2, i + n + 1 do jids[#jids + 1] = ARGV[j] end
  i = i + n + 2
  local bad = insane(bid, {"jids"})
  if bad then return redis.error_reply(bad) end
  if redis.call("exists", k(bid)) == 0 then
    if strict then
      return redis.error_reply("WURKBATCH batch " .. bid ..
                               " does not exist (expired or never made)")
    end
    unknown[#unknown + 1] = bid
  elseif redis.call("exists", k(bid, "success")) == 1 then
    return redis.error_reply("WURKBATCH batch " .. bid ..
                             " already succeeded: no jobs can join it")
  else
    for _, v in ipairs(redis.call("hmget", k(bid), "total", "pending")) do
      if v and not string.match(v, "^%-?%d+$") then  -- HINCRBY would fail mid-write
        return redis.error_reply("WURKBATCH " .. k(bid) .. " holds a count that is not a number")
      end
    end
    groups[#groups + 1] = {bid, jids}
  end
end
local bad = unwritable(i)
if bad then return redis.error_reply(bad) end
for _, g in ipairs(groups) do count(g[1], g[2]) end
write(i)
return unknown
""")

# ARGV = [guard hash, guard field, guard ttl, bid, parent, hold, expires_in, prune score,
#         nfields, (field, value) pairs, njids, jid * njids, write tail].
# Replies 1 when this call launched the batch, 0 when the guard says it was
# launched before (nothing written), or an error with nothing written.
LAUNCH = batch_script("batch_launch", _WRITE + """
local guard, field = ARGV[1], ARGV[2]
if redis.call("type", guard)["ok"] ~= "hash" and redis.call("exists", guard) == 1 then
  return redis.error_reply("WURKBATCH " .. guard .. " is not a hash")
end
if redis.call("hexists", guard, field) == 1 then return 0 end
local bid, nf = ARGV[4], tonumber(ARGV[9])
local fields = {}
for j = 10, 9 + 2 * nf do fields[#fields + 1] = ARGV[j] end
local i = 10 + 2 * nf
local nj = tonumber(ARGV[i])
local jids = {}
for j = i + 1, i + nj do jids[#jids + 1] = ARGV[j] end
local bad = unwritable(i + nj + 1)
  or create(bid, ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8], fields)
if bad then return redis.error_reply(bad) end
count(bid, jids)
write(i + nj + 1)
redis.call("hset", guard, field, bid)
redis.call("expire", guard, tonumber(ARGV[3]))
settle(bid)
return 1
""")


def write_args(immediate: dict[str, list[str]], scheduled: Iterable[tuple[str, str]]) -> list[Any]:
    """The write tail: jobs by queue (payloads in push order), then (score, payload) pairs."""
    tail: list[Any] = [len(immediate)]
    for queue, payloads in immediate.items():
        tail += [queue, len(payloads), *payloads]
    pairs = list(scheduled)
    tail.append(len(pairs))
    for score, payload in pairs:
        tail += [score, payload]
    return tail

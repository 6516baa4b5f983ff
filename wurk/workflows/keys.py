"""Workflows on the wire: key names and the one script that ends a step.

A workflow is a root batch (``b-<wid>``, its ``workflow`` field the stored
definition) plus these keys, all prefixed ``wurk:wf:<wid>``:

* ``wurk:wf:<wid>`` HASH: policy, state, description, created_at,
  finished_at, stopped_by;
* ``...:steps`` HASH: step name -> JSON record {state, bid, jobs, error};
* ``...:jids`` HASH: step name -> JSON list of the jids its jobs get (made
  once, before the first push, so a replayed launch reuses them);
* ``...:waiting`` HASH: step name -> predecessors not yet succeeded;
* ``...:ends`` HASH: step name -> "success" or "death", written once;
* ``...:owner`` HASH: step name -> the step whose end released it;
* ``...:launched`` HASH: step name (``""`` for the root batch) -> its bid,
  written by the script that launched it (Lua ``batch_launch``), whose
  guard it is: a replayed launch finds it and writes nothing.
``wurk:workflows`` is the index (a ZSET of wids by creation time);
``wurk:workflows:retire`` scores each wid by when its keys expire (creation
plus the expiry, then the linger once finished), and each new workflow's
:data:`INIT` drops up to RETIRE_DRAIN due entries from both, so the index
holds the workflows whose keys live.

Duties:
1. Name the keys; hold the reserved job name, the root hold, the TTLs.
2. :data:`INIT`: write the workflow's hash, its waiting counts and the
   index entry once (a replay finds the hash and changes nothing), and
   retire the index entries of workflows whose keys are gone.
3. :data:`END`: record a step's end once (``HSETNX``) and, on success,
   count it out of its successors, giving each one it releases an owner;
   on a death under the "stop" policy, record what stopped the workflow.
"""

from __future__ import annotations

from wurk.wire.lua import Script

ADVANCE = "wurk.workflow.advance"  # the reserved name of the internal job
INDEX = "wurk:workflows"
RETIRE = "wurk:workflows:retire"  # wid -> when its keys expire
RETIRE_DRAIN = 100  # retired at most per INIT: bounded work, ahead of one finish per start
ROOT_HOLD = "hold:workflow"  # the root batch's hold, dropped when the workflow ends
ROOT_FIELD = ""  # the root batch's field in ``launched`` (a step name is never empty)
LINGER = 24 * 3600  # a finished workflow's keys live this long
PARTS = ("steps", "jids", "waiting", "ends", "owner", "launched")


def key(wid: str, part: str = "") -> str:
    return f"wurk:wf:{wid}:{part}" if part else f"wurk:wf:{wid}"


def all_keys(wid: str) -> list[str]:
    return [key(wid), *(key(wid, p) for p in PARTS)]


# ARGV = [wid, step, "success" | "death", policy, successor, ...].
# Replies 1 when this call recorded the end, 0 for a replay.
END = Script(
    "workflow_end",
    """
local base = "wurk:wf:" .. ARGV[1]
if redis.call("type", base .. ":ends")["ok"] ~= "hash"
    and redis.call("exists", base .. ":ends") == 1 then
  return redis.error_reply("WURKWF " .. base .. ":ends is not a hash")
end
if redis.call("hsetnx", base .. ":ends", ARGV[2], ARGV[3]) == 0 then return 0 end
local ttl = redis.call("ttl", base)
if ttl > 0 then redis.call("expire", base .. ":ends", ttl) end
if ARGV[3] == "success" then
  for i = 5, #ARGV do
    if redis.call("hincrby", base .. ":waiting", ARGV[i], -1) == 0 then
      redis.call("hset", base .. ":owner", ARGV[i], ARGV[2])
      if ttl > 0 then redis.call("expire", base .. ":owner", ttl) end
    end
  end
elseif ARGV[4] == "stop" then
  redis.call("hsetnx", base, "stopped_by", ARGV[2])
end
return 1
""",
)


# ARGV = [wid, ttl, created_at, index score, n, (field, value) * n, (step, count) ...]:
# the hash's fields, then each waiting step with its predecessor count.
# Replies 1 when this call wrote them, 0 for a replay (the hash exists).
# created_at is the clock the retiring goes by: an entry due by then whose
# hash is gone leaves the index; one whose hash lives is looked at again later.
INIT = Script(
    "workflow_init",
    """
local base, ttl, n = "wurk:wf:" .. ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local now = tonumber(ARGV[3])
if redis.call("exists", base) == 1 then return 0 end
for _, wid in ipairs(redis.call("zrangebyscore", "%(retire)s", "-inf", now,
                                "LIMIT", 0, %(drain)d)) do
  local left = redis.call("ttl", "wurk:wf:" .. wid)
  if left == -2 then
    redis.call("zrem", "%(index)s", wid)
    redis.call("zrem", "%(retire)s", wid)
  else
    if left < 0 then left = %(linger)d end
    redis.call("zadd", "%(retire)s", now + left, wid)
  end
end
for i = 6, 5 + 2 * n, 2 do redis.call("hset", base, ARGV[i], ARGV[i + 1]) end
redis.call("hset", base, "created_at", ARGV[3])
redis.call("expire", base, ttl)
if #ARGV > 5 + 2 * n then
  for i = 6 + 2 * n, #ARGV, 2 do redis.call("hset", base .. ":waiting", ARGV[i], ARGV[i + 1]) end
  redis.call("expire", base .. ":waiting", ttl)
end
redis.call("zadd", "%(index)s", ARGV[4], ARGV[1])
redis.call("zadd", "%(retire)s", now + ttl, ARGV[1])
return 1
""" % {"index": INDEX, "retire": RETIRE, "drain": RETIRE_DRAIN,  # noqa: UP031 - Lua braces
       "linger": LINGER},
)

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
* ``...:owner`` HASH: step name -> the step whose end released it.
``wurk:workflows`` is the index (a ZSET of wids by creation time).

Duties:
1. Name the keys; hold the reserved job name, the root hold, the TTLs.
2. :data:`END`: record a step's end once (``HSETNX``) and, on success,
   count it out of its successors, giving each one it releases an owner;
   on a death under the "stop" policy, record what stopped the workflow.
"""

from __future__ import annotations

from wurk.wire.lua import Script

ADVANCE = "wurk.workflow.advance"  # the reserved name of the internal job
INDEX = "wurk:workflows"
ROOT_HOLD = "hold:workflow"  # the root batch's hold, dropped when the workflow ends
STEP_HOLD = "hold:workflow-step"
LINGER = 24 * 3600  # a finished workflow's keys live this long
PARTS = ("steps", "jids", "waiting", "ends", "owner")


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

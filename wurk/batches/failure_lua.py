"""The batches' failure step as a Lua function, shared by two scripts.

``job_failed(bid, jid, info, died)`` is what a failure does to a batch:
record the jid in ``b-<bid>-failed`` with its error (``-failinfo``), and
for a job that will never run again (died, dropped, deleted or killed by a
person) in ``-died`` too, firing ``death``; then settle the batch, which
fires ``complete``/``success`` when due. The worker's ``batch_failed``
(:mod:`wurk.batches.lua`) calls it for a job that failed, and the
admin's removal script (:mod:`wurk.api.removal_lua`) for a job a person
removed, so both ends are counted by the same rule.

It is appended to the batch prelude, whose helpers (``k``, ``keep``,
``death``, ``settle``, ``stamp``) it uses; the caller checks the batch's
key types (``insane``) first. Replies 1, 0 when the jid is not pending (it
succeeded before), -1 when the batch is gone.
"""

from __future__ import annotations

FAILURE_STEP = """
local function job_failed(bid, jid, info, died)
  if redis.call("exists", k(bid)) == 0 then return -1 end
  if redis.call("sismember", k(bid, "jids"), jid) == 0 then return 0 end
  if redis.call("sadd", k(bid, "failed"), jid) == 1 then
    redis.call("hincrby", k(bid), "failures", 1)
    keep(bid, k(bid, "failed"))
  end
  redis.call("hset", k(bid, "failinfo"), jid, info)
  keep(bid, k(bid, "failinfo"))
  redis.call("hset", k(bid), "updated_at", stamp)
  if died == "1" then
    redis.call("sadd", k(bid, "died"), jid)
    keep(bid, k(bid, "died"))
    death(bid)
  end
  settle(bid)
  return 1
end
"""

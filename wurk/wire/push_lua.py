"""The marked push: jobs and the connection's push mark in one step, checked first.

A plain push (no replica confirmation) writes its jobs and sets its
connection's mark (``keys.push_mark``) to the push's number on that
connection, all or nothing (:mod:`wurk.push.landing`): one key per
connection, overwritten by each push, so ordinary pushes leave nothing per
job behind. Commands on one connection run in order, and a connection whose
push failed is never used for another mark, so a mark holding at least
``n`` proves that push number ``n`` landed; a mark below it (or gone)
proves it did not.

:data:`PUSH_MARKED` is that push for one job (a bulk slice sends the same
writes in a MULTI/EXEC, so its payloads need not pass through Lua), and for
any push sent again after a try whose reply was lost: it carries the
(mark, number) pairs of the earlier tries and writes nothing where one
shows the earlier try landed.
"""

from __future__ import annotations

from wurk.wire.lua import Script

# KEYS: the queues set, this connection's mark, the marks of earlier
#       attempts of the same jobs, then one destination per group (a queue
#       list, or the schedule set).
# ARGV: this push's number, the mark's TTL, how many earlier attempts, their
#       numbers, then per group: the queue name ("" for the schedule), the
#       count of jobs, and the payloads (score and payload pairs for the schedule).
PUSH_MARKED = Script(
    "push_marked",
    """
local seen = tonumber(ARGV[3])
for e = 1, seen do
  local mark = tonumber(redis.call("get", KEYS[2 + e]) or "")
  if mark and mark >= tonumber(ARGV[3 + e]) then return 0 end
end
local k, a = 3 + seen, 4 + seen
while a <= #ARGV do
  local queue, n = ARGV[a], tonumber(ARGV[a + 1])
  if queue == "" then
    redis.call("zadd", KEYS[k], unpack(ARGV, a + 2, a + 1 + 2 * n))
    a = a + 2 + 2 * n
  else
    redis.call("sadd", KEYS[1], queue)
    redis.call("lpush", KEYS[k], unpack(ARGV, a + 2, a + 1 + n))
    a = a + 2 + n
  end
  k = k + 1
end
redis.call("set", KEYS[2], ARGV[1], "EX", ARGV[2])
return 1
""",
)

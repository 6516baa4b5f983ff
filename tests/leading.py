"""A Leader in a process of its own, for test_leader_processes.py.

``python tests/leading.py URL NAME TTL IDENTITY OUT`` campaigns for NAME and
appends one JSON line to OUT per sample (every 10 ms):

- ``{"before": t0, "after": t1, "lead": true, "token": n, "value": v, "fenced": 0|1}``
  while it leads: ``is_leader()`` was True at some moment between t0 and t1
  (``time.monotonic()``, one clock for every process on the host), and
  ``fenced`` says whether a fenced write sent right after was let through;
- ``{"before": t0, "after": t1, "lead": false}`` on each sample where it
  does not lead;
- ``{"stale": 0|1, "at": t}`` once after each tenure: a write fenced with
  that tenure's (key, value), as a paused ex-leader would send it.

SIGTERM calls ``stop()``, writes ``{"stopped": t}`` and exits 0.

An optional sixth argument, DELAY, holds every round trip of the Leader's
for that many seconds before it is sent (an injected slow network), so a
sample taken while a renewal is under way is sure to happen.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import IO, Any

import redis

from wurk.runtime.leader import Leader
from wurk.settings.config import Config

FENCED_PUSH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
SAMPLE = 0.01


def fenced(client: redis.Redis, fence: tuple[str, str], token: int) -> int:
    """1 when let through, 0 when refused, -1 when Redis did not answer."""
    key, value = fence
    try:
        return int(client.eval(FENCED_PUSH, 2, key, "fenced-log", value, token))  # type: ignore[arg-type]
    except redis.RedisError:
        return -1


def sample(leader: Leader, client: redis.Redis, last: dict[str, Any]) -> dict[str, Any]:
    before = time.monotonic()
    leading = leader.is_leader()
    fence, token = leader.fence(), leader.token
    after = time.monotonic()
    if leading and fence is not None and token is not None:
        last.update(fence=fence, token=token)
        return {"before": before, "after": after, "lead": True, "token": token,
                "value": fence[1], "fenced": fenced(client, fence, token)}
    return {"before": before, "after": after, "lead": False}


def campaign(leader: Leader, client: redis.Redis, out: IO[str], done: threading.Event) -> None:
    last: dict[str, Any] = {}
    was_leading = False
    while not done.is_set():
        line = sample(leader, client, last)
        if was_leading and not line["lead"]:
            stale = fenced(client, last["fence"], last["token"])
            out.write(json.dumps({"stale": stale, "at": time.monotonic()}) + "\n")
        was_leading = line["lead"]
        out.write(json.dumps(line) + "\n")
        done.wait(SAMPLE)


def main() -> None:
    url, name, ttl, identity, path = sys.argv[1:6]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    leader = Leader(name, ttl=float(ttl), identity=identity,
                    config=Config(redis_url=url, log_level="warning"))
    if len(sys.argv) > 6:
        delay, run = float(sys.argv[6]), leader._run
        leader._run = lambda block: (time.sleep(delay), run(block))[1]  # type: ignore[method-assign]
    leader.start()
    client = redis.Redis.from_url(url, socket_timeout=5)
    with open(path, "a", buffering=1) as out:
        try:
            campaign(leader, client, out, done)
        finally:
            leader.stop()
            out.write(json.dumps({"stopped": time.monotonic()}) + "\n")


if __name__ == "__main__":
    main()

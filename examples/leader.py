"""Leader election: one process of the cluster runs the hourly report.

Run several copies against one Redis (``python -m examples.leader``): one
says it leads; stop it (Ctrl-C) and another takes over within seconds.
The report's bookkeeping is a fenced write, so a leader that was paused
past its lease cannot record a run after another process took over.
"""

from __future__ import annotations

import time

import redis

import wurk

# Refuses (returns nil) unless the lease still holds this tenure's value.
FENCED_INCR = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return nil end
return redis.call('INCR', KEYS[2])
"""


def record_run(client: redis.Redis, fence: tuple[str, str] | None) -> int | None:
    """Count one run of the leader-only work; None when not (or no longer) leading."""
    if fence is None:
        return None
    lease_key, value = fence
    runs = client.eval(FENCED_INCR, 2, lease_key, "report:runs", value)  # type: ignore[arg-type]
    return None if runs is None else int(runs)


def main(rounds: int | None = None, config: wurk.Config | None = None) -> None:
    config = config or wurk.default_config()
    client = redis.Redis.from_url(config.redis_url)
    with wurk.Leader("reports", config=config) as leader:
        done = 0
        while rounds is None or done < rounds:
            if leader.is_leader():
                print("leading with token", leader.token, "run", record_run(client, leader.fence()))
            done += 1
            time.sleep(1)
    client.close()


if __name__ == "__main__":
    main()

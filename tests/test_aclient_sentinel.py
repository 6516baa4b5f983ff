"""The asyncio client through Redis Sentinel (redis.asyncio.sentinel): it
finds the primary by asking the sentinels, and follows a failover without
losing or doubling a push. Real servers and sentinels (tests/test_sentinel.py's cluster).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import waiting
from test_sentinel import MASTER, ErrorLog, SentinelCluster, client_for, cluster, sentinel_config

import wurk

__all__ = ["cluster"]  # the fixture, imported for its use here


def jids_on(port: int) -> list[str]:
    with client_for(port) as c:
        return [json.loads(raw)["jid"] for raw in reversed(c.lrange("queue:default", 0, -1))]


@pytest.mark.timeout(60)
def test_async_pushes_follow_a_sentinel_failover(cluster: SentinelCluster) -> None:
    old, new = cluster.primary, cluster.replica
    config = sentinel_config(cluster, ErrorLog())

    async def main() -> list[str | None]:
        async with wurk.AsyncClient(config) as client:
            assert client.confirmed is not None  # with Sentinel, pushes wait for a replica
            before = [await client.push({"class": "Echo", "args": [i]}) for i in range(5)]
            with client_for(cluster.sentinel_ports[1]) as c:
                await asyncio.to_thread(waiting.wait_for, lambda: c.execute_command(
                    "SENTINEL", "FAILOVER", MASTER), 10, 0.1, "failover accepted",
                    (redis.RedisError,))
            deadline = time.monotonic() + 30
            after: list[str | None] = []
            while len(after) < 5 and time.monotonic() < deadline:
                # Refused (NOREPLICAS, READONLY) or unconfirmed while it runs: buffered.
                after.append(await client.push({"class": "Echo", "args": [100 + len(after)]}))
                await asyncio.sleep(0.3)
            assert client.buffer is not None and await client.buffer.flush(30)
            return before + after

    jids = asyncio.run(main())
    waiting.wait_for(lambda: cluster.master_ports() == {new.port}, 15, 0.1, "new master",
                     (redis.RedisError,))
    landed = jids_on(new.port)
    assert len(jids) == 10 and sorted(landed) == sorted(jids)  # each once, none lost
    assert old.port != new.port

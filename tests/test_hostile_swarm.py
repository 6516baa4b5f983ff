"""Hostile payloads against a real 2 x 5 swarm: payloads no worker can write
back (a lone surrogate in the jid, the class or the args) go to the dead set
with the reason, and the good jobs pushed behind them all run."""

from __future__ import annotations

import json
import time

import pytest
import redis
import swarms
from conftest import RedisServer
from swarms import Launch, slot
from waiting import wait_for

from wurk.api import DeadSet
from wurk.settings.config import Config

launch = swarms.launch
pytestmark = pytest.mark.timeout(150)

GOOD = 100


def surrogate_payloads() -> list[str]:
    """Twelve payloads as Python's json.dumps writes a surrogate-escaped filename."""
    name = b"report-\xff.txt".decode("utf-8", "surrogateescape")  # '\udcff' inside
    now = time.time()
    payloads = []
    for n in range(4):
        base = {"class": "record", "args": [f"bad-{n}"], "queue": "hq", "jid": f"bad{n:021d}",
                "retry": True, "created_at": now, "enqueued_at": now}
        payloads += [
            json.dumps({**base, "jid": f"{name}-{n}"}),
            json.dumps({**base, "class": f"{name}-{n}"}),
            json.dumps({**base, "args": [name, n]}),
        ]
    return payloads


def test_twelve_unwritable_payloads_do_not_stop_a_swarm(launch: Launch, r: redis.Redis,
                                                       redis_server: RedisServer) -> None:
    bad = surrogate_payloads()
    assert all("\\udcff" in raw for raw in bad)
    r.sadd("queues", "hq")
    # Oldest first: every bad payload is fetched before any good job.
    r.lpush("queue:hq", *bad)
    good = [swarms.push(r, "hq", "record", f"good-{n}") for n in range(GOOD)]
    assert len(good) == GOOD
    swarm = launch(slot("w", count=2, concurrency=5, queues=["hq"]), layout={"w": 2},
                   log_level="warning")
    swarm.wait_ready()
    def good_done() -> set[str]:
        return {t.split(":")[0] for t in r.lrange("done", 0, -1) if t.startswith("good-")}

    try:
        wait_for(lambda: len(good_done()) >= GOOD, 60, what=f"{GOOD} good jobs run")
    finally:
        print(f"good jobs run: {len(good_done())} of {GOOD}")
    dead = DeadSet(config=Config(redis_url=redis_server.url))
    entries = wait_for(lambda: (lambda e: e if len(e) >= len(bad) else None)(list(dead)), 30,
                       what="the twelve in dead")
    raw_kept = {e.value.decode("utf-8") for e in entries}
    assert raw_kept == set(bad)  # byte for byte as they were pushed
    for entry in entries:
        assert entry.error_class == "PayloadError"
        assert "surrogate" in (entry.error_message or "")
    assert r.llen("queue:hq") == 0
    assert r.zcard("retry") == 0

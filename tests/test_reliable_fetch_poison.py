"""Poison pills: a job recovered from dead processes too often goes to
``dead``; malformed payloads are recovered without a crash; a suspect (a job
that was running when its process died) runs alone, and a busy process
leaves it queued.

Real Redis; dead processes are faked by writing what they leave behind.
"""

from __future__ import annotations

import threading
import time

import redis
from fetching import Define, Launch, blocked_in_brpoplpush, fake_dead_owner, jid_of, payload, wip
from waiting import wait_for

from wurk.runtime.reaper import recover
from wurk.settings.config import Config
from wurk.wire import keys


def test_job_recovered_too_often_goes_to_dead(r: redis.Redis, rb: redis.Redis,
                                              config: Config) -> None:
    assert config.max_recoveries == 3
    raw = payload("Poison", "x", queue="rfp")
    pill = keys.pill(jid_of(raw))
    for attempt in range(1, 5):
        identity = f"doomed:{attempt}:cafecafecafe"
        # The job was claimed from its queue by a process that then died.
        if attempt > 1:
            assert rb.rpoplpush("queue:rfp", wip(identity, "rfp")) == raw
        else:
            rb.lpush(wip(identity, "rfp"), raw)
        rb.sadd(keys.WIP_OWNERS, identity)
        rb.sadd(keys.wip_queues(identity), "rfp")
        before = time.time()
        requeued, killed = recover(config, identity)
        assert r.get(pill) == str(attempt)
        assert keys.PILL_TTL - 5 < r.ttl(pill) <= keys.PILL_TTL
        assert not rb.exists(wip(identity, "rfp"))
        assert identity not in r.smembers(keys.WIP_OWNERS)
        assert not r.exists(keys.wip_queues(identity))
        if attempt <= 3:
            assert (requeued, killed) == (1, 0)
            assert rb.lrange("queue:rfp", 0, -1) == [raw]
            assert r.zcard("dead") == 0
        else:
            assert (requeued, killed) == (0, 1)
            assert rb.llen("queue:rfp") == 0
            assert rb.zrange("dead", 0, -1) == [raw]
            at = rb.zscore("dead", raw)
            assert at is not None
            assert before - 1 <= at <= time.time() + 1
    assert r.get(pill) == "4"


def test_recover_requeues_malformed_payloads_without_crashing(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
    good = payload("Good", 1, queue="rfm")
    odd: list[bytes] = [b"not json {", b"[1, 2]", b'{"jid": null}', b'{"jid": 42}', b"42",
                        b"\xff\xfe\x00binary", b'"a string"', b"", good]
    # Alone in a dead process's lists a job is blamed, so its jid is looked for.
    for n, raw in enumerate(odd):
        identity = f"broken:{n}:deadbeefdead"
        fake_dead_owner(rb, identity, "rfm", raw)
        assert recover(config, identity) == (1, 0)
        assert identity not in r.smembers(keys.WIP_OWNERS)
    assert rb.lrange("queue:rfm", 0, -1) == odd
    assert [k.decode() for k in rb.scan_iter(match="wurk:pill:*")] == [keys.pill(jid_of(good))]
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted(odd)
    rb.delete("queue:rfm")

    # All together: claimed in this order, the private list holds the newest first.
    identity = "broken:all:deadbeefdead"
    fake_dead_owner(rb, identity, "rfm", *odd)
    assert recover(config, identity) == (len(odd), 0)
    # Oldest claimed ends nearest the fetch (right) end.
    assert rb.lrange("queue:rfm", 0, -1) == list(reversed(odd))
    assert r.get(keys.pill(jid_of(good))) == "1"  # from before: not blamed again
    assert "rfm" in r.smembers("queues")
    assert identity not in r.smembers(keys.WIP_OWNERS)
    assert r.zcard("dead") == 0


def test_a_suspect_runs_alone_and_a_busy_process_leaves_it_queued(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    config.concurrency = 3
    config.queues = ["rfs"]
    config.fetch_timeout = 2.0  # the idle threads' BRPOPLPUSH is what takes the suspect
    held = {"busy": threading.Event(), "suspect": threading.Event()}
    ran: list[str] = []

    def work(tag: str) -> None:
        ran.append(tag)
        if tag in held:
            held[tag].wait(10)

    job = define(work)
    busy, first, second, normal = (payload(job.name, tag, queue="rfs")
                                   for tag in ("busy", "suspect", "other-suspect", "normal"))
    rb.lpush("queue:rfs", busy)
    launcher = launch()
    mine = wip(launcher.identity, "rfs")
    try:
        wait_for(lambda: ran == ["busy"] and blocked_in_brpoplpush(r))
        # A dead process held two jobs: both come back as suspects, neither blamed.
        fake_dead_owner(rb, "ghost:9:cccccccccccc", "rfs", first, second)
        assert recover(config, "ghost:9:cccccccccccc") == (2, 0)
        rb.lpush("queue:rfs", normal)
        # The blocked move took the first suspect, and gave it back: we are busy.
        wait_for(lambda: not blocked_in_brpoplpush(r), timeout=3)
        time.sleep(0.5)
        assert ran == ["busy"]
        assert rb.lrange("queue:rfs", 0, -1) == [normal, second, first]
        assert rb.lrange(mine, 0, -1) == [busy]
        assert not blocked_in_brpoplpush(r)  # it waits to be idle; it does not block
        assert r.get(keys.pill(jid_of(first))) is None

        held["busy"].set()
        wait_for(lambda: ran == ["busy", "suspect"])
        time.sleep(0.3)
        # Alone: nothing claimed beside it, though two threads are idle.
        assert ran == ["busy", "suspect"]
        assert rb.lrange(mine, 0, -1) == [first]
        assert rb.lrange("queue:rfs", 0, -1) == [normal, second]
    finally:
        for event in held.values():
            event.set()
    wait_for(lambda: ran == ["busy", "suspect", "other-suspect", "normal"])
    wait_for(lambda: not rb.exists(mine))
    assert not rb.exists(keys.SUSPECTS)  # each acknowledged run cleared its mark
    assert rb.llen("queue:rfs") == 0

"""Poison pills: a job that crashed its process alone too often goes to
``dead``, saying so, while deaths without evidence never blame or isolate;
malformed payloads are recovered without a crash; a suspect (a job that was
running when its process crashed) runs alone, and a busy process leaves it
queued; suspect marks fade.

Real Redis; dead processes are faked by writing what they leave behind.
"""

from __future__ import annotations

import json
import threading
import time

import redis
from fetching import Define, Launch, blocked_in_brpoplpush, fake_dead_owner, jid_of, payload, wip
from tuning import tuned
from waiting import wait_for

from wurk.redis.runtime import runtime_for
from wurk.runtime.reaper import NO_EVIDENCE, RELEASED, crashed, recover
from wurk.settings.config import Config
from wurk.unique import keys as unique
from wurk.wire import keys

SEGV = crashed("killed by SIGSEGV")


def test_job_that_crashed_its_process_too_often_goes_to_dead(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
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
        requeued, killed = recover(runtime_for(config), identity, cause=SEGV)
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
            (entry,) = rb.zrange("dead", 0, -1)
            # The job as it was, with the failure fields saying why it died.
            job = json.loads(entry)
            assert {k: v for k, v in job.items()
                    if k not in ("error_class", "error_message", "failed_at")} == json.loads(raw)
            assert job["error_class"] == "ProcessCrashed"
            assert job["error_message"].startswith(
                "it crashed its worker process 4 times while it ran alone "
                "(the last: killed by SIGSEGV), more than max_recoveries (3)")
            at = rb.zscore("dead", entry)
            assert at is not None
            assert before - 1 <= at <= time.time() + 1
            assert before - 1 <= job["failed_at"] <= time.time() + 1
            assert not rb.exists(keys.SUSPECTS)
    assert r.get(pill) == "4"


def test_deaths_without_evidence_never_blame_or_isolate(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
    """A SIGKILL from outside, a lapsed heartbeat, a stop: however often a job
    is alone in such a process, it goes back to run again, not to dead."""
    raw = payload("Healthy", "x", queue="rfn")
    others = [payload("Healthy", n, queue="rfn") for n in range(3)]
    for attempt in range(10):
        identity = f"killed:{attempt}:abababababab"
        fake_dead_owner(rb, identity, "rfn", raw, *(others if attempt % 2 else []))
        cause = RELEASED if attempt == 9 else NO_EVIDENCE
        assert recover(runtime_for(config), identity, cause=cause) == (1 + 3 * (attempt % 2), 0)
        assert rb.lrange("queue:rfn", -1, -1) == [raw]
        rb.delete("queue:rfn")
    assert r.zcard("dead") == 0
    assert not rb.exists(keys.pill(jid_of(raw)))
    assert not rb.exists(keys.SUSPECTS)


def test_a_crash_in_company_makes_suspects_and_marks_fade(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
    jobs = [payload("Any", n, queue="rfc") for n in range(3)]
    fake_dead_owner(rb, "crashed:1:acacacacacac", "rfc", *jobs)
    at = time.time()
    assert recover(runtime_for(config), "crashed:1:acacacacacac", at - keys.SUSPECT_TTL - 10,
                   cause=SEGV) == (3, 0)
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted(jobs)
    for raw in jobs:
        assert not rb.exists(keys.pill(jid_of(raw)))  # in company: nobody blamed
    # The next crash, a suspect TTL later, finds the old marks faded.
    fresh = payload("Any", "fresh", queue="rfc")
    fake_dead_owner(rb, "crashed:2:acacacacacac", "rfc", fresh, jobs[0])
    assert recover(runtime_for(config), "crashed:2:acacacacacac", at, cause=SEGV) == (2, 0)
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted([fresh, jobs[0]])
    assert 0 < r.ttl(keys.SUSPECTS) <= keys.SUSPECT_TTL


def test_recover_requeues_malformed_payloads_without_crashing(
        r: redis.Redis, rb: redis.Redis, config: Config) -> None:
    good = payload("Good", 1, queue="rfm")
    odd: list[bytes] = [b"not json {", b"[1, 2]", b'{"jid": null}', b'{"jid": 42}', b"42",
                        b"\xff\xfe\x00binary", b'"a string"', b"", good]
    # Alone in a dead process's lists a job is blamed, so its jid is looked for.
    for n, raw in enumerate(odd):
        identity = f"broken:{n}:deadbeefdead"
        fake_dead_owner(rb, identity, "rfm", raw)
        assert recover(runtime_for(config), identity, cause=SEGV) == (1, 0)
        assert identity not in r.smembers(keys.WIP_OWNERS)
    assert rb.lrange("queue:rfm", 0, -1) == odd
    assert [k.decode() for k in rb.scan_iter(match="wurk:pill:*")] == [keys.pill(jid_of(good))]
    assert sorted(rb.zrange(keys.SUSPECTS, 0, -1)) == sorted(odd)
    rb.delete("queue:rfm")

    # All together: claimed in this order, the private list holds the newest first.
    identity = "broken:all:deadbeefdead"
    fake_dead_owner(rb, identity, "rfm", *odd)
    assert recover(runtime_for(config), identity, cause=SEGV) == (len(odd), 0)
    # Oldest claimed ends nearest the fetch (right) end.
    assert rb.lrange("queue:rfm", 0, -1) == list(reversed(odd))
    assert r.get(keys.pill(jid_of(good))) == "1"  # from before: not blamed again
    assert "rfm" in r.smembers("queues")
    assert identity not in r.smembers(keys.WIP_OWNERS)
    assert r.zcard("dead") == 0


def test_a_suspect_runs_alone_and_a_busy_process_leaves_it_queued(
        r: redis.Redis, rb: redis.Redis, config: Config, define: Define,
        launch: Launch) -> None:
    # the idle threads' BRPOPLPUSH is what takes the suspect
    config = tuned(config, concurrency=3, queues=["rfs"], fetch_timeout=2.0)
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
        # A crashed process held two jobs: both come back as suspects, neither blamed.
        fake_dead_owner(rb, "ghost:9:cccccccccccc", "rfs", first, second)
        assert recover(runtime_for(config), "ghost:9:cccccccccccc", cause=SEGV) == (2, 0)
        rb.lpush("queue:rfs", normal)
        # The blocked move took the first suspect, and gave it back: we are busy.
        wait_for(lambda: not blocked_in_brpoplpush(r))
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


def test_a_poison_pill_frees_its_unique_lock(r: redis.Redis, rb: redis.Redis,
                                             config: Config) -> None:
    """Its death is an end like any other (DESIGN invariant 10): the lock
    goes, if it still holds this job's jid, so the work can be pushed again."""
    config = tuned(config, max_recoveries=0)
    for holder in ("self", "other"):
        job = {"class": "Unique", "args": [holder], "jid": f"jid-{holder}", "queue": "rfu",
               "unique_for": 3600}
        raw = json.dumps(job).encode()
        lock = unique.lock_key("Unique", "rfu", [holder])
        rb.set(lock, job["jid"] if holder == "self" else "a-duplicate", ex=3600)
        identity = f"crashed:{holder}:dededededede"
        fake_dead_owner(rb, identity, "rfu", raw)
        assert recover(runtime_for(config), identity, cause=SEGV) == (0, 1)
        # Ours goes; a duplicate's (pushed after ours expired) stays.
        assert r.exists(lock) == (holder == "other")
    assert r.zcard("dead") == 2

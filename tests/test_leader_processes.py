"""Leader election across real processes on one Redis (each runs tests/leading.py):
never two leaders at once, by token and by time; stop() hands over at once;
kill -9 and SIGSTOP of the leader.

Each process samples ``is_leader()`` every 10 ms with ``time.monotonic()``
(one clock for every process on the host) before and after the call, so a
sample proves that the process believed it led at some moment in between.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer
from waiting import wait_for

HELPER = Path(__file__).with_name("leading.py")
NAME = "procs"
LEASE = f"wurk:leader:{NAME}"


@dataclass
class Candidate:
    identity: str
    proc: subprocess.Popen[bytes]
    out: Path

    def records(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):  # a line still being written
                found.append(json.loads(line))
        return found

    def samples(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "lead" in r]


class Field:
    def __init__(self, server: RedisServer, tmp_path: Path) -> None:
        self.server = server
        self.tmp_path = tmp_path
        self.candidates: list[Candidate] = []

    def spawn(self, count: int, ttl: float, *extra: str) -> list[Candidate]:
        for _ in range(count):
            identity = f"c{len(self.candidates)}"
            out = self.tmp_path / f"{identity}.jsonl"
            proc = subprocess.Popen([sys.executable, str(HELPER), self.server.url, NAME,
                                     str(ttl), identity, str(out), *extra])
            self.candidates.append(Candidate(identity, proc, out))
        for each in self.candidates:
            wait_for(each.samples, timeout=30, what=f"{each.identity} sampling")
        return self.candidates

    def holder(self, r: redis.Redis) -> Candidate | None:
        value = r.get(LEASE)
        if value is None:
            return None
        identity = str(value).split(" ", 1)[1].rsplit("/", 1)[0]
        return next(c for c in self.candidates if c.identity == identity)

    def leading(self, r: redis.Redis, other_than: Candidate | None = None) -> Candidate:
        """The candidate that holds the lease and has sampled itself leading."""
        def found() -> Candidate | None:
            each = self.holder(r)
            if each is None or each is other_than:
                return None
            return each if any(s["lead"] for s in each.samples()) else None
        return wait_for(found, timeout=10, what="a leader")

    def stop_all(self) -> None:
        for each in self.candidates:
            if each.proc.poll() is None:
                each.proc.send_signal(signal.SIGCONT)
                each.proc.terminate()
        for each in self.candidates:
            each.proc.wait(15)


@pytest.fixture
def field(redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> Iterator[Field]:
    made = Field(redis_server, tmp_path)
    yield made
    for each in made.candidates:
        if each.proc.poll() is None:
            each.proc.kill()
            each.proc.wait(10)


@dataclass
class Tenure:
    token: int
    identity: str
    first_after: float
    last_before: float


def tenures(candidates: list[Candidate]) -> list[Tenure]:
    """Every tenure seen, by token; asserts a token is never shared."""
    found: dict[int, Tenure] = {}
    for each in candidates:
        for s in each.samples():
            if not s["lead"]:
                continue
            seen = found.setdefault(s["token"], Tenure(s["token"], each.identity,
                                                       s["after"], s["before"]))
            assert seen.identity == each.identity, f"token {s['token']} held by two processes"
            seen.first_after = min(seen.first_after, s["after"])
            seen.last_before = max(seen.last_before, s["before"])
    return sorted(found.values(), key=lambda t: t.token)


def assert_one_leader_at_a_time(candidates: list[Candidate]) -> list[Tenure]:
    """If tenures never overlap and tokens grow with time, every sample of a
    tenure began before every sample of the next ended."""
    found = tenures(candidates)
    for prev, nxt in itertools.pairwise(found):
        assert prev.last_before < nxt.first_after, f"{prev} overlaps {nxt}"
    return found


def assert_fenced_writes_in_order(r: redis.Redis, candidates: list[Candidate]) -> None:
    """Every write fenced by a believed tenure got through; the log is in token order."""
    refused = [s for c in candidates for s in c.samples() if s["lead"] and s["fenced"] != 1]
    assert refused == []
    log = [int(t) for t in r.lrange("fenced-log", 0, -1)]
    assert log and log == sorted(log)


def first_lead_since(candidate: Candidate, since: float) -> float:
    """The end of the first sample since ``since`` in which the candidate led:
    it took the lease before that moment (its own clock reading, so a test
    that looks late on a loaded machine does not move it)."""
    return min(s["after"] for s in candidate.samples() if s["lead"] and s["before"] >= since)


def test_many_processes_over_many_renewals_and_handovers(field: Field, r: redis.Redis) -> None:
    ttl = 3.0
    field.spawn(3, ttl)
    early = []
    for _ in range(2):
        first = field.leading(r)
        time.sleep(ttl * 2)  # six renewals
        sent = time.monotonic()
        # The old lease's own end, had nobody released it (read after ``sent``,
        # so it ends no earlier than this).
        expires = sent + r.pttl(LEASE) / 1000
        first.proc.terminate()
        heir = field.leading(r, other_than=first)
        early.append(expires - first_lead_since(heir, sent))
        assert first.proc.wait(10) == 0
    time.sleep(ttl)
    field.stop_all()
    found = assert_one_leader_at_a_time(field.candidates)
    assert len(found) >= 3
    assert_fenced_writes_in_order(r, field.candidates)
    # A released lease is taken at a follower's next try (at most ttl/3
    # later), before the old lease would have expired (at least 2/3 of the
    # TTL later): the heir led while the old lease still had time to run.
    assert min(early) > 0, early


def test_kill_9_of_the_leader_hands_over_within_the_ttl(field: Field, r: redis.Redis) -> None:
    ttl = 1.5
    field.spawn(3, ttl)
    victim = field.leading(r)
    old = max(s["token"] for s in victim.samples() if s["lead"])
    killed = time.monotonic()
    victim.proc.kill()
    heir = field.leading(r, other_than=victim)
    # The lease's expiry, then a follower's next try (at most ttl/3), by the
    # heir's own samples; three TTLs leave room for a loaded machine.
    took = first_lead_since(heir, killed) - killed
    assert took <= 3 * ttl, took
    wait_for(lambda: any(s["lead"] for s in heir.samples()), timeout=5)
    field.stop_all()
    found = assert_one_leader_at_a_time(field.candidates)
    assert found[-1].token > old
    assert_fenced_writes_in_order(r, field.candidates)


def test_a_leader_stopped_past_its_ttl_does_not_lead_on_resume(field: Field,
                                                               r: redis.Redis) -> None:
    ttl = 1.0
    # Each round trip is held 100 ms before it is sent, so samples run while
    # the first renewal after the pause is still under way: is_leader() must
    # already be False then, by the clock alone.
    field.spawn(2, ttl, "0.1")
    paused = field.leading(r)
    old = [s for s in paused.samples() if s["lead"]][-1]
    os.kill(paused.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    heir = field.leading(r, other_than=paused)
    time.sleep(max(0.0, stopped + 2 * ttl - time.monotonic()))
    # What a fenced write of the paused leader would carry is refused now.
    assert int(r.eval("if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end return 0",
                      1, LEASE, old["value"])) == 0  # type: ignore[arg-type]
    resumed = time.monotonic()
    os.kill(paused.proc.pid, signal.SIGCONT)
    wait_for(lambda: any(x.get("at", 0) > resumed and "stale" in x for x in paused.records()),
             timeout=5, what="the paused leader noticing")
    noticed = time.monotonic()
    wait_for(lambda: len([s for s in paused.samples() if s["before"] >= noticed]) >= 10,
             timeout=10, what="samples after the paused leader noticed")
    field.stop_all()
    after = [s for s in paused.samples() if s["before"] >= resumed]
    assert after and not any(s["lead"] and s["token"] == old["token"] for s in after)
    stale = [x["stale"] for x in paused.records() if "stale" in x and x["at"] > resumed]
    assert stale == [0]  # its late write with the old fence was refused
    found = assert_one_leader_at_a_time(field.candidates)
    assert all(t.token > old["token"] for t in found if t.identity == heir.identity)
    assert_fenced_writes_in_order(r, field.candidates)


def test_a_process_that_exits_normally_releases_its_lease(redis_server: RedisServer,
                                                          r: redis.Redis) -> None:
    code = ("import sys, wurk\n"
            "from wurk.settings.config import Config\n"
            "one = wurk.leader('exit', ttl=30, config=Config(redis_url=sys.argv[1]))\n"
            "assert one.wait_until_leader(10)\n"
            "print(one.fence()[1])\n")
    done = subprocess.run([sys.executable, "-c", code, redis_server.url], check=True,
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip()  # it led, with a 30 s lease...
    assert r.get("wurk:leader:exit") is None  # ...that it gave back as it exited

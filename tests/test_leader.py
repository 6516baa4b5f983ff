"""Leader election in one process: the lease, its token and fence, belief by
the clock, callbacks, garbage in Redis, bad arguments, and fork.

The tests with competing processes, kill -9, SIGSTOP and Redis restarts are
in test_leader_processes.py.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import RedisServer, fill_to_maxmemory, start_redis
from faultproxy import FaultProxy
from structlog.testing import capture_logs
from waiting import EVENTUALLY, wait_for

import wurk
from wurk.core import threads
from wurk.runtime import leader as leader_module
from wurk.runtime.leader import Leader, current_holder
from wurk.runtime.leader_policy import MARGIN, error_pause, follower_pause
from wurk.settings.config import Config
from wurk.wire.lease import (
    LEASE_ACQUIRE,
    BadLeaseReplyError,
    Holder,
    parse_acquired,
    parse_holder,
)

TTL = 1.0
# A fenced write: what a leader-only Lua script does before it writes.
FENCED_SET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
"""

MakeLeader = Callable[..., Leader]


@pytest.fixture
def make_with() -> Iterator[Callable[..., Leader]]:
    """Leaders on a given config, stopped after the test."""
    made: list[Leader] = []

    def build(config: Config, name: str = "t", **kw: object) -> Leader:
        kw.setdefault("ttl", TTL)
        each = Leader(name, config=config, **kw)  # type: ignore[arg-type]
        made.append(each)
        return each

    yield build
    for each in made:
        each.stop()


@pytest.fixture
def make(config: Config, make_with: Callable[..., Leader]) -> MakeLeader:
    """Leaders on the test config, stopped after the test."""
    return lambda name="t", **kw: make_with(config, name, **kw)


def fenced_set(r: redis.Redis, fence: tuple[str, str], value: str) -> int:
    key, expected = fence
    return int(r.eval(FENCED_SET, 2, key, "fenced", expected, value))  # type: ignore[arg-type]


def the_leader(*candidates: Leader, timeout: float = 5.0) -> Leader:
    return wait_for(lambda: next((c for c in candidates if c.is_leader()), None),
                    timeout=timeout, what="a leader")


# -- the lease -------------------------------------------------------------------------


def test_one_of_two_leads_and_its_fence_is_the_lease(make: MakeLeader, r: redis.Redis) -> None:
    a, b = make(identity="a").start(), make(identity="b").start()
    first = the_leader(a, b)
    other = b if first is a else a
    assert not other.is_leader() and other.token is None and other.fence() is None
    assert first.lease_key == "wurk:leader:t"
    fence = first.fence()
    assert fence is not None
    assert r.get("wurk:leader:t") == fence[1] == f"{first.token} {first.identity}/" + \
        fence[1].rsplit("/", 1)[1]
    assert 0 < r.pttl("wurk:leader:t") <= TTL * 1000
    assert int(r.get("wurk:leader-token:t") or 0) == first.token
    assert fenced_set(r, fence, "by the leader") == 1


def test_the_lease_is_renewed_and_the_tenure_kept(make: MakeLeader, r: redis.Redis) -> None:
    one = make().start()
    assert one.wait_until_leader(5)
    token = one.token
    for _ in range(4):  # well past the TTL: only renewals keep it
        wait_for(lambda: r.pttl("wurk:leader:t") > TTL * 1000 * 0.8)
        wait_for(lambda: r.pttl("wurk:leader:t") < TTL * 1000 * 0.7)
    assert one.is_leader() and one.token == token


def test_stop_releases_and_hands_over(make: MakeLeader, r: redis.Redis) -> None:
    a, b = make(identity="a").start(), make(identity="b").start()
    first = the_leader(a, b)
    other = b if first is a else a
    old = first.token
    assert old is not None
    first.stop()
    assert not first.is_leader() and first.fence() is None
    # A released lease is taken at the follower's next try, not after the TTL.
    assert other.wait_until_leader(TTL * 0.6)
    assert (other.token or 0) > old


def test_a_stop_that_times_out_releases_and_a_late_renewal_is_not_believed(
        make: MakeLeader, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader_module, "JOIN_TIMEOUT", 0.1)
    lost: list[int] = []
    one = make(on_lost=lambda: lost.append(1))
    held, go_on = threading.Event(), threading.Event()
    run = one._run

    def slow_reply(block: Callable[..., Any]) -> Any:
        reply = run(block)
        service = one.service
        mine = service is not None and threading.current_thread() is service.thread
        if mine and one.is_leader():
            held.set()  # a renewal applied in Redis, its reply not yet read
            go_on.wait(5)
        return reply

    one._run = slow_reply  # type: ignore[method-assign]
    one.start()
    assert held.wait(EVENTUALLY)
    tenure = one._tenure
    assert tenure is not None
    one.stop()
    assert not one.is_leader() and r.get("wurk:leader:t") is None and lost == [1]
    # The renewal's reply, when it comes, cannot make the tenure current again.
    assert not one._believe(tenure)
    go_on.set()
    assert one.service is not None
    thread = one.service.thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and not one.is_leader() and lost == [1]


def test_a_follower_stopping_leaves_the_leaders_lease(make: MakeLeader, r: redis.Redis) -> None:
    a, b = make(identity="a").start(), make(identity="b").start()
    first = the_leader(a, b)
    (b if first is a else a).stop()
    assert first.is_leader() and r.get("wurk:leader:t") == (first.fence() or ("", ""))[1]


def test_names_elect_independently(make: MakeLeader) -> None:
    a, b = make("one").start(), make("two").start()
    assert a.wait_until_leader(5) and b.wait_until_leader(5)


def test_wurk_leader_starts_one_and_the_context_manager_stops_it(config: Config,
                                                                 r: redis.Redis) -> None:
    started = wurk.leader("ctx", ttl=TTL, config=config)
    try:
        assert started.wait_until_leader(5)
    finally:
        started.stop()
    assert r.get("wurk:leader:ctx") is None
    with Leader("ctx", ttl=TTL, config=config) as held:
        assert held.wait_until_leader(5)
    assert not held.is_leader() and r.get("wurk:leader:ctx") is None


def test_wait_until_leader_times_out_as_a_follower(make: MakeLeader) -> None:
    first = make().start()
    assert first.wait_until_leader(5)
    assert make().start().wait_until_leader(0.3) is False
    with pytest.raises(RuntimeError, match="start"):
        make().wait_until_leader(0.1)


# -- belief by the clock ---------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_belief_ends_before_the_lease_can_and_a_new_tenure_follows(make: MakeLeader,
                                                                   r: redis.Redis) -> None:
    clock = FakeClock()
    one = make(clock=clock).start()
    assert one.wait_until_leader(5)
    old_token, old_fence = one.token, one.fence()
    assert old_fence is not None and old_token is not None
    # As if the process had been paused: no renewal ran, and the belief is
    # gone at once, while the lease in Redis still has a fifth of its TTL.
    clock.now += TTL * (1 - MARGIN) + 0.001
    assert not one.is_leader() and one.token is None and one.fence() is None
    # The thread ends that tenure and starts a new one with a larger token;
    # the old fence no longer lets a write through.
    assert one.wait_until_leader(5)
    assert (one.token or 0) > old_token
    assert fenced_set(r, old_fence, "late write") == 0
    assert r.get("fenced") is None


# -- Redis trouble ----------------------------------------------------------------------


def own_config(server: RedisServer, **kw: Any) -> Config:
    return Config(redis_url=server.url, log_level="warning", **kw)


def test_a_redis_restart_elects_again_with_a_larger_token(own_redis: RedisServer,
                                                          make_with: MakeLeader) -> None:
    cfg = own_config(own_redis)
    a, b = make_with(cfg, identity="a").start(), make_with(cfg, identity="b").start()
    old = the_leader(a, b).token
    assert old is not None
    own_redis.stop()
    restarted = start_redis(port=own_redis.port)
    try:
        # The restarted server has neither the lease nor the counter: the
        # holder's renewal finds the lease gone, and the token, seeded from
        # the clock, still grows.
        now = wait_for(lambda: next((x for x in (a, b) if (x.token or 0) > old), None),
                       timeout=10, what="a new tenure")
        with restarted.client() as client:
            assert client.get("wurk:leader-token:t") == str(now.token)
    finally:
        a.stop()
        b.stop()
        restarted.stop()
        shutil.rmtree(restarted.workdir, ignore_errors=True)


def test_redis_down_ends_the_belief_within_the_ttl_and_the_campaign_goes_on(
        own_redis: RedisServer, make_with: MakeLeader) -> None:
    failures: list[str] = []
    cfg = own_config(own_redis, on_redis_error=lambda error, **_: failures.append(str(error)))
    one = make_with(cfg).start()
    assert one.wait_until_leader(5)
    own_redis.stop()
    down = time.monotonic()  # the last renewal was confirmed before this

    def believed_no_longer() -> bool:
        # A True is a belief at some moment after ``asked``: it must be within
        # the TTL of the outage, however late a loaded machine lets us ask.
        asked = time.monotonic()
        if one.is_leader():
            assert asked - down <= TTL, f"still the leader {asked - down:.2f} s after Redis went"
            return False
        return True

    wait_for(believed_no_longer, timeout=10, interval=0.01, what="the belief ended")
    failures.clear()
    since = time.monotonic()
    wait_for(lambda: len(failures) >= 8, timeout=10, what="the campaign still trying")
    count, took = len(failures), time.monotonic() - since
    # Still trying, paced (at most a sixth of the TTL apart, give or take a
    # quarter), and never spinning; the thread is alive and not reported dead.
    assert count <= took / (TTL / 6 * 0.75) + 2, (count, took)
    assert one.service is not None and one.service.alive()
    assert "leader:t" not in threads.dead()
    restarted = start_redis(port=own_redis.port)
    try:
        assert one.wait_until_leader(5)
    finally:
        one.stop()
        restarted.stop()
        shutil.rmtree(restarted.workdir, ignore_errors=True)


def test_the_leader_keeps_its_lease_at_maxmemory(own_redis: RedisServer,
                                                 make_with: MakeLeader) -> None:
    one = make_with(own_config(own_redis)).start()
    assert one.wait_until_leader(5)
    token = one.token
    with own_redis.client() as client:
        fill_to_maxmemory(client)
        # Renewals (PEXPIRE) are allowed when Redis is full: one sent a whole
        # TTL after the fill shows the lease lived on renewals, not its rest.
        full = time.monotonic()
        wait_for(lambda: confirmed_since(one, full + TTL), timeout=10, what="a renewal when full")
        assert one.is_leader() and one.token == token
        client.flushall()


def confirmed_since(leader: Leader, moment: float) -> bool:
    """The tenure was last confirmed by a round trip sent after ``moment``."""
    tenure = leader._tenure
    return tenure is not None and tenure.confirmed > moment


def warmed(leader: Leader) -> Leader:
    """Dial the Leader's own connection now, so an armed fault hits a command."""
    leader._pool = leader._make_pool()
    leader._pool.call("PING")
    return leader


def test_an_acquire_whose_reply_was_lost_is_adopted_at_once(proxy: FaultProxy, r: redis.Redis,
                                                            make_with: MakeLeader) -> None:
    r.script_load(LEASE_ACQUIRE.source)
    one = warmed(make_with(Config(redis_url=proxy.url, log_level="warning")))
    proxy.drop_next_reply()
    with capture_logs() as logs:
        one.start()
        # Not orphaned: without adoption the lease taken by the lost attempt
        # would block everyone, this process included, for the whole TTL.
        assert one.wait_until_leader(TTL / 2)
    assert [e["failures"] for e in logs if e["event"] == "leader.error"] == [1]
    assert r.get("wurk:leader:t") == (one.fence() or ("", ""))[1]


def test_a_renewal_whose_reply_was_lost_keeps_the_tenure(proxy: FaultProxy, r: redis.Redis,
                                                         make_with: MakeLeader) -> None:
    one = make_with(Config(redis_url=proxy.url, log_level="warning")).start()
    assert one.wait_until_leader(5)
    token = one.token
    dropped = time.monotonic()
    proxy.drop_next_reply()
    # A renewal sent a whole TTL after the lost reply was confirmed: the
    # tenure went on through it.
    wait_for(lambda: confirmed_since(one, dropped + TTL), timeout=10, what="a later renewal")
    assert one.is_leader() and one.token == token


# -- callbacks ---------------------------------------------------------------------------


def test_callbacks_run_and_a_raising_one_does_not_end_the_campaign(make: MakeLeader) -> None:
    events: list[str] = []

    def elected() -> None:
        events.append("elected")
        raise RuntimeError("boom in on_elected")

    with capture_logs() as logs:
        one = make(on_elected=elected, on_lost=lambda: events.append("lost")).start()
        assert one.wait_until_leader(5)
        one.stop()
    assert events == ["elected", "lost"]
    failed = [e for e in logs if e["event"] == "leader.callback_failed"]
    assert failed and "boom in on_elected" in failed[0]["error"]
    assert "leader:t" not in threads.dead()


# -- garbage in Redis -------------------------------------------------------------------


def test_a_foreign_value_without_expiry_cannot_block_the_election(make: MakeLeader,
                                                                  r: redis.Redis) -> None:
    r.set("wurk:leader:t", "not a lease")
    one = make().start()
    wait_for(lambda: r.pttl("wurk:leader:t") > 0, what="an expiry given")
    assert one.wait_until_leader(TTL * 3)


def test_a_lease_key_of_the_wrong_type_expires_and_the_election_goes_on(
        make: MakeLeader, r: redis.Redis) -> None:
    r.hset("wurk:leader:t", "x", "1")
    one = make().start()
    assert one.wait_until_leader(TTL * 3)


@pytest.mark.parametrize("garbage", ["abc", "-5", "1e300", "nan", "9007199254740993"])
def test_a_garbage_counter_gives_a_clock_seeded_token(make: MakeLeader, r: redis.Redis,
                                                      garbage: str) -> None:
    r.set("wurk:leader-token:t", garbage)
    now_ms = int(float(r.time()[0]) * 1000)
    one = make().start()
    assert one.wait_until_leader(5)
    assert now_ms <= (one.token or 0) < now_ms + 60_000


def test_a_counter_ahead_of_the_clock_still_grows(make: MakeLeader, r: redis.Redis) -> None:
    r.set("wurk:leader-token:t", str(2**52))
    one = make().start()
    assert one.wait_until_leader(5)
    assert one.token == 2**52 + 1


# -- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "error", "match"), [
    ({"name": ""}, ValueError, "leader name"),
    ({"name": "a b"}, ValueError, "without spaces"),
    ({"name": "x" * 201}, ValueError, "leader name"),
    ({"name": "bad\n"}, ValueError, "printable"),
    ({"name": 5}, TypeError, "string"),
    ({"ttl": 0.5}, ValueError, "between 1 and"),
    ({"ttl": float("inf")}, ValueError, "between"),
    ({"ttl": float("nan")}, ValueError, "between"),
    ({"ttl": True}, TypeError, "number"),
    ({"ttl": "15"}, TypeError, "number"),
    ({"identity": ""}, ValueError, "identity"),
    ({"identity": 3}, TypeError, "identity"),
    ({"on_elected": "no"}, TypeError, "on_elected must be callable"),
])
def test_bad_arguments_are_refused_clearly(config: Config, kw: dict[str, object],
                                           error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Leader(config=config, **kw)  # type: ignore[arg-type]


def test_a_bad_timeout_is_refused(make: MakeLeader) -> None:
    one = make().start()
    with pytest.raises(ValueError, match="timeout"):
        one.wait_until_leader(-1)


# -- pauses ----------------------------------------------------------------------------


def test_error_pauses_double_up_to_a_sixth_of_the_ttl() -> None:
    rng = random.Random(1)
    pauses = [error_pause(n, 15.0, rng) for n in range(1, 12)]
    assert 0.0375 <= pauses[0] <= 0.0625
    assert all(p <= 15.0 / 6 * 1.25 for p in pauses)
    assert pauses[-1] >= 15.0 / 6 * 0.75
    assert error_pause(10**6, 15.0, rng) <= 15.0 / 6 * 1.25  # no overflow for ever


def test_a_follower_waits_for_the_lease_to_run_out_but_at_most_a_third_of_the_ttl() -> None:
    rng = random.Random(1)
    assert 0.2 < follower_pause(0.2, 15.0, rng) < 0.23
    assert follower_pause(60.0, 15.0, rng) == 5.0


# -- fork -------------------------------------------------------------------------------


def test_a_forked_child_does_not_believe_its_parents_tenure(make: MakeLeader) -> None:
    one = make().start()
    assert one.wait_until_leader(5)
    parent_identity = one.identity
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        seen = {"leader": one.is_leader(), "token": one.token, "fence": one.fence(),
                "live": one in leader_module._live,
                "own_identity": one.identity != parent_identity}
        os.write(write_end, json.dumps(seen).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert seen == {"leader": False, "token": None, "fence": None, "live": True,
                    "own_identity": True}
    assert one.is_leader()  # the parent's tenure is untouched


# -- reading the lease back (untrusted) ---------------------------------------------------


def test_current_holder_names_the_leader(make: MakeLeader, config: Config) -> None:
    assert current_holder("t", config) is None
    one = make(identity="web-1:42:abc").start()
    assert one.wait_until_leader(5)
    assert current_holder("t", config) == Holder(one.token or 0, "web-1:42:abc")


@pytest.mark.parametrize("raw", [
    None, 5, [b"1"], b"", b"x", b"12", b"12 id", b"12 id/short", b"0 id/12345678",
    b"-1 id/12345678", b"1e3 id/12345678", b"9" * 5000 + b" id/12345678",
    str(2**53).encode() + b" id/12345678", b"12 /12345678",
])
def test_what_is_not_a_lease_value_names_no_holder(raw: object) -> None:
    assert parse_holder(raw) is None


@pytest.mark.parametrize("reply", [
    None, [], [1], [2, b"x"], [0, -1], [0, b"5"], [1, 5], [1, b"12 other/abcdabcd"],
    [1, b"9" * 5000 + b" me/abcdabcd"], [1, b"0 me/abcdabcd"], [1, b"\xff me/abcdabcd"],
])
def test_a_garbage_acquire_reply_is_an_error_not_a_tenure(reply: object) -> None:
    with pytest.raises(BadLeaseReplyError):
        parse_acquired(reply, "me/abcdabcd")


# -- the how-to's example ---------------------------------------------------------------


def test_the_examples_fenced_write_counts_only_while_leading(make: MakeLeader,
                                                            r: redis.Redis) -> None:
    from examples.leader import record_run

    one = make("reports").start()
    assert one.wait_until_leader(5)
    fence = one.fence()
    assert record_run(r, fence) == 1
    one.stop()
    assert record_run(r, one.fence()) is None
    assert record_run(r, fence) is None  # the ended tenure's fence is refused
    assert r.get("report:runs") == "1"


def test_the_example_runs(config: Config, r: redis.Redis,
                          capsys: pytest.CaptureFixture[str]) -> None:
    from examples.leader import main

    main(rounds=2, config=config)
    assert "leading with token" in capsys.readouterr().out
    assert r.get("wurk:leader:reports") is None

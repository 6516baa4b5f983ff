"""Leader election in one process: the lease, its token and fence, belief by
the clock, callbacks, garbage in Redis, bad arguments, and fork.

The tests with competing processes, kill -9, SIGSTOP and Redis restarts are
in test_leader_processes.py.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator

import pytest
import redis
from structlog.testing import capture_logs
from waiting import wait_for

import wurk
from wurk.core import threads
from wurk.runtime import leader as leader_module
from wurk.runtime.leader import MARGIN, Leader, error_pause, follower_pause
from wurk.settings.config import Config

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
def make(config: Config) -> Iterator[MakeLeader]:
    """Leaders on the test config, stopped after the test."""
    made: list[Leader] = []

    def build(name: str = "t", **kw: object) -> Leader:
        kw.setdefault("ttl", TTL)
        each = Leader(name, config=config, **kw)  # type: ignore[arg-type]
        made.append(each)
        return each

    yield build
    for each in made:
        each.stop()


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
        wait_for(lambda: r.pttl("wurk:leader:t") > TTL * 1000 * 0.8, timeout=2)
        wait_for(lambda: r.pttl("wurk:leader:t") < TTL * 1000 * 0.7, timeout=2)
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
    wait_for(lambda: r.pttl("wurk:leader:t") > 0, timeout=2, what="an expiry given")
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
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        seen = {"leader": one.is_leader(), "token": one.token, "fence": one.fence(),
                "live": [each is one for each in leader_module._live]}
        os.write(write_end, json.dumps(seen).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert seen == {"leader": False, "token": None, "fence": None, "live": [True]}
    assert one.is_leader()  # the parent's tenure is untouched

"""When reliable fetch sends an acknowledgement, and from which thread.

An ack normally rides along with the next claim. Two cases have no next
claim soon: the fetcher blocks in BRPOPLPUSH (the ack must go at once, and a
caller that must not wait on Redis, the asyncio executor's loop, hands that
round trip to a bookkeeping thread through ``send``), and the process is
quiet (nobody asks for work; the ack must still go within ``ACK_DELAY``, not
wait for the stop, or a crash in between would run a finished job again).

A real ReliableFetch against the test's redis-server; the processor side is
this test's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from fetching import blocked_in_brpoplpush, jid_of, payload, wip
from tuning import tuned
from waiting import wait_for

from wurk.runtime.reliable_fetch import ACK_DELAY, ReliableFetch
from wurk.runtime.work import UnitOfWork
from wurk.settings.config import Config
from wurk.settings.queues import parse_queues

pytestmark = pytest.mark.timeout(30)
IDENTITY = "acks-host:1:0123456789ab"


@pytest.fixture
def fetch(config: Config) -> Iterator[ReliableFetch]:
    # Acks wait for ten of them, or ACK_DELAY, or a claim; a block is long
    # enough to act while it lasts.
    config = tuned(config, concurrency=10, fetch_timeout=5.0)
    started = ReliableFetch(config, parse_queues(["default"]), IDENTITY)
    yield started
    started.stop()


@pytest.fixture
def blocked(fetch: ReliableFetch, r: redis.Redis, rb: redis.Redis) -> Iterator[UnitOfWork]:
    """One job claimed and running; the fetcher blocked in Redis for a second taker."""
    raw = payload("AckJob", 1)
    rb.lpush("queue:default", raw)
    fetch.start()
    work = fetch.fetch()
    assert work is not None and work.raw == raw
    waiter = threading.Thread(target=fetch.fetch, daemon=True)  # finds the queue empty
    waiter.start()
    wait_for(lambda: blocked_in_brpoplpush(r), what="the fetcher blocking")
    yield work
    rb.lpush("queue:default", payload("AckJob", 2))  # ends the block
    waiter.join(5)


def test_an_ack_made_while_the_fetcher_blocks_is_sent_through_send(
        fetch: ReliableFetch, blocked: UnitOfWork, rb: redis.Redis) -> None:
    sent: list[Callable[[], None]] = []
    fetch.acknowledge(blocked, jid_of(blocked.raw), send=sent.append)
    assert len(sent) == 1  # the round trip is handed over, not made here
    assert rb.lrange(wip(IDENTITY, "default"), 0, -1) == [blocked.raw]
    sent[0]()  # what the bookkeeping thread runs
    assert rb.llen(wip(IDENTITY, "default")) == 0


def test_without_send_the_blocked_case_sends_on_the_calling_thread(
        fetch: ReliableFetch, blocked: UnitOfWork, rb: redis.Redis) -> None:
    fetch.acknowledge(blocked, jid_of(blocked.raw))
    assert rb.llen(wip(IDENTITY, "default")) == 0  # sent before acknowledge returned


def test_an_ack_after_quiet_goes_within_the_ack_delay_not_at_stop(
        fetch: ReliableFetch, rb: redis.Redis) -> None:
    raws = [payload("AckJob", n) for n in range(2)]
    rb.lpush("queue:default", *raws)
    fetch.start()
    works = [fetch.fetch(), fetch.fetch()]
    assert all(works)
    fetch.quiet()  # nobody asks for work from now on: no claim will carry the acks
    time.sleep(0.3)  # the fetcher finishes its last round and waits, with nothing due
    for work in works:
        assert work is not None
        fetch.acknowledge(work, jid_of(work.raw))
    # Two acks of a batch of ten: only the ACK_DELAY timer sends them.
    wait_for(lambda: rb.llen(wip(IDENTITY, "default")) == 0, timeout=ACK_DELAY + 2,
             what="the acks sent while quiet")

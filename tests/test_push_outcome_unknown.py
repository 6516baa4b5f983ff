"""A push whose reply was lost: the caller is told the outcome is unknown, with
the jid, and a push of that jid again is enqueued once whether or not the
first landed. Real Redis behind the fault proxy (tests/faultproxy.py): a
dropped reply is a push that landed, a dropped request one that did not."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import wurk
from tests.conftest import RedisServer
from tests.faultproxy import FaultProxy
from tests.test_batch_faults import LosesReply
from wurk.push.job import JobFunction, Registry
from wurk.push.landing import PushOutcomeUnknown
from wurk.redis.pool import RedisPool
from wurk.settings.config import Config
from wurk.wire import keys

Fault = Callable[[FaultProxy], None]
# Each fault with whether the push it hits reaches Redis.
FAULTS = {"reply lost (it landed)": (FaultProxy.drop_next_reply, True),
          "request lost (it did not)": (FaultProxy.drop_next_request, False)}


def settings(url: str, **extra: Any) -> Config:
    # One try: the lost reply is the caller's to handle (with more, the pool
    # replays it itself; see test_a_lost_reply_is_replayed_once_by_the_pool).
    extra.setdefault("redis_retry_attempts", 1)
    return Config(redis_url=url, redis_connect_timeout=0.3, redis_retry_base=0.01,
                  log_level="warning", **extra)


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[wurk.Client]:
    made = wurk.Client(settings(proxy.url), buffered=False, drain_spool=False)
    made.push({"class": "Echo", "args": ["warm"]})  # a live connection for the fault to hit
    yield made
    made.pool.close()


@pytest.fixture
def echo() -> JobFunction[..., None]:
    @wurk.job(name="Echo", registry_=Registry())
    def echo_job(word: str | int) -> None:  # words, and numbers for the bulk pushes
        pass

    return echo_job


def jids_in(r: redis.Redis, key: str = keys.queue("default")) -> list[str]:
    raws = r.lrange(key, 0, -1) if r.type(key) == "list" else r.zrange(key, 0, -1)
    return sorted(json.loads(raw)["jid"] for raw in raws)


def copies(r: redis.Redis, jid: str, key: str = keys.queue("default")) -> int:
    return jids_in(r, key).count(jid)


@pytest.mark.parametrize("fault", FAULTS)
def test_perform_async_says_the_outcome_is_unknown_and_its_jid_retries_once(
        proxy: FaultProxy, r: redis.Redis, client: wurk.Client,
        echo: JobFunction[..., None], fault: str) -> None:
    arm, lands = FAULTS[fault]
    arm(proxy)
    with pytest.raises(wurk.PushOutcomeUnknown, match="outcome unknown") as lost:
        echo.set(client=client).perform_async("maybe")
    error = lost.value
    assert error.queue == "default" and error.jids == (error.jid,) and error.jid in str(error)
    assert isinstance(error.__cause__, redis.ConnectionError)
    assert copies(r, error.jid) == (1 if lands else 0)
    assert echo.set(client=client, jid=error.jid).perform_async("maybe") == error.jid
    assert copies(r, error.jid) == 1
    # Once it landed, the jid is an ordinary one again: a deliberate new push of it is.
    client.push({"class": "Echo", "args": ["again"], "jid": error.jid})
    assert copies(r, error.jid) == 2


@pytest.mark.parametrize("fault", FAULTS)
def test_a_raw_push_retried_with_its_jid_and_new_fields_is_enqueued_once(
        proxy: FaultProxy, r: redis.Redis, client: wurk.Client, fault: str) -> None:
    arm, _ = FAULTS[fault]
    arm(proxy)
    with pytest.raises(PushOutcomeUnknown) as lost:
        client.push({"class": "Echo", "args": ["maybe"]})
    # A new created_at, enqueued_at, even other arguments: the jid decides.
    assert client.push({"class": "Echo", "args": ["maybe"], "jid": lost.value.jid,
                        "created_at": time.time()}) == lost.value.jid
    assert copies(r, lost.value.jid) == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_a_scheduled_push_retried_with_its_jid_is_scheduled_once(
        proxy: FaultProxy, r: redis.Redis, client: wurk.Client,
        echo: JobFunction[..., None], fault: str) -> None:
    arm, lands = FAULTS[fault]
    arm(proxy)
    with pytest.raises(PushOutcomeUnknown) as lost:
        echo.set(client=client).perform_in(600, "later")
    jid = lost.value.jid
    assert copies(r, jid, keys.SCHEDULE) == (1 if lands else 0)
    # The retry's payload differs (its own created_at and run time): still one copy.
    echo.set(client=client, jid=jid).perform_at(time.time() + 700, "later")
    assert copies(r, jid, keys.SCHEDULE) == 1
    assert copies(r, jid) == 0


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bulk_push_retried_is_enqueued_once(proxy: FaultProxy, r: redis.Redis,
                                              client: wurk.Client, fault: str) -> None:
    arm, lands = FAULTS[fault]
    arm(proxy)
    with pytest.raises(PushOutcomeUnknown) as lost:
        client.push_bulk({"class": "Echo", "args": [[i] for i in range(5)]})
    jids = lost.value.jids
    assert len(jids) == 5 and lost.value.jid == jids[0]
    assert sum(copies(r, jid) for jid in jids) == (5 if lands else 0)
    lost.value.retry()
    assert [copies(r, jid) for jid in jids] == [1] * 5
    # Pushed again one by one with their jids: nothing doubles either way.
    arm(proxy)
    with pytest.raises(PushOutcomeUnknown) as again:
        client.push_bulk({"class": "Echo", "args": [[i] for i in range(3)]})
    for jid in again.value.jids:
        client.push({"class": "Echo", "args": [0], "jid": jid})
    assert [copies(r, jid) for jid in again.value.jids] == [1] * 3


def test_a_lost_reply_is_replayed_once_by_the_pool(proxy: FaultProxy, r: redis.Redis) -> None:
    client = wurk.Client(settings(proxy.url, redis_retry_attempts=3), buffered=False,
                         drain_spool=False)
    client.push({"class": "Echo", "args": ["warm"]})
    proxy.drop_next_reply()
    jid = client.push({"class": "Echo", "args": ["once"]})
    assert jid is not None and copies(r, jid) == 1
    client.pool.close()


def test_a_replay_that_cannot_reconnect_is_still_unknown(proxy: FaultProxy,
                                                        r: redis.Redis) -> None:
    client = wurk.Client(settings(proxy.url, redis_retry_attempts=3), buffered=False,
                         drain_spool=False)
    client.push({"class": "Echo", "args": ["warm"]})
    proxy.drop_next_reply()
    proxy.refuse()  # the live connection still relays; every new dial is refused
    with pytest.raises(PushOutcomeUnknown) as lost:
        client.push({"class": "Echo", "args": ["landed"]})
    assert isinstance(lost.value.__cause__, redis.ConnectionError)
    # While Redis stays out of reach, a retry says so again (it may have landed).
    with pytest.raises(PushOutcomeUnknown):
        lost.value.retry()
    proxy.heal()
    lost.value.retry()
    assert copies(r, lost.value.jid) == 1
    client.pool.close()


def test_a_push_that_never_left_keeps_its_connect_error(proxy: FaultProxy,
                                                        r: redis.Redis) -> None:
    client = wurk.Client(settings(proxy.url), buffered=False, drain_spool=False)
    proxy.refuse()  # no connection yet, none can be made: nothing was sent
    with pytest.raises(redis.ConnectionError) as refused:
        client.push({"class": "Echo", "args": ["never"]})
    assert not isinstance(refused.value, PushOutcomeUnknown)
    assert r.llen(keys.queue("default")) == 0
    client.pool.close()


def test_a_unique_job_retried_with_its_jid_keeps_its_lock_and_lands_once(
        redis_server: RedisServer, r: redis.Redis) -> None:
    # The lock is taken in a round trip of its own: a pool that loses the
    # reply of the write itself, not the proxy's next request.
    config = settings(redis_server.url)
    pool = LosesReply(RedisPool.from_config(config))
    client = wurk.Client(config, pool=pool, buffered=False, drain_spool=False)  # type: ignore[arg-type]
    pool.armed = True
    with pytest.raises(PushOutcomeUnknown) as lost:
        client.push({"class": "Echo", "args": ["u"], "unique_for": 60})
    assert client.push({"class": "Echo", "args": ["u"], "unique_for": 60,
                        "jid": lost.value.jid}) == lost.value.jid
    assert copies(r, lost.value.jid) == 1
    assert client.push({"class": "Echo", "args": ["u"], "unique_for": 60}) is None
    pool.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_the_async_client_says_so_and_retries_once(proxy: FaultProxy, r: redis.Redis,
                                                    echo: JobFunction[..., None],
                                                    fault: str) -> None:
    arm, lands = FAULTS[fault]

    async def main() -> list[PushOutcomeUnknown]:
        lost: list[PushOutcomeUnknown] = []
        async with wurk.AsyncClient(settings(proxy.url), buffered=False,
                                    drain_spool=False) as aclient:
            enqueuer = echo.set(client=aclient)
            for push in (lambda e: e.aperform_async("now"),
                         lambda e: e.aperform_in(600, "later"),
                         lambda e: aclient.push_bulk({"class": "Echo", "args": [[1], [2]]})):
                await aclient.push({"class": "Warm", "args": []})  # a live connection to hit
                arm(proxy)
                with pytest.raises(PushOutcomeUnknown) as error:
                    await push(enqueuer)
                lost.append(error.value)
            now, later, bulk = lost
            assert copies(r, now.jid) == copies(r, later.jid, keys.SCHEDULE) == int(lands)
            await echo.set(client=aclient, jid=now.jid).aperform_async("now")
            await echo.set(client=aclient, jid=later.jid).aperform_in(650, "later")
            await bulk.retry()
        return lost

    now, later, bulk = asyncio.run(main())
    assert copies(r, now.jid) == 1
    assert copies(r, later.jid, keys.SCHEDULE) == 1
    assert [copies(r, jid) for jid in bulk.jids] == [1, 1]


def test_a_jid_is_given_per_push_and_checked(echo: JobFunction[..., None]) -> None:
    with pytest.raises(TypeError, match="jid must be a non-empty string"):
        echo.set(jid=5)
    with pytest.raises(TypeError, match="per push"):
        wurk.job(name="Fixed", registry_=Registry(), jid="a" * 24)(lambda: None)
    with pytest.raises(TypeError, match="per push"):
        class Fixed(wurk.Job, jid="a" * 24):
            def perform(self) -> None:
                pass
    with pytest.raises(TypeError, match="perform_bulk gives each job its own"):
        echo.set(jid="a" * 24).perform_bulk([["x"], ["y"]])

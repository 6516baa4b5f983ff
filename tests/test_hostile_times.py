"""Times no clock reaches: refused at push, and shown, not crashed on, when another
client wrote them (issue 25, item 6).

A push refuses infinity, NaN and times beyond the year 5138 with
``wurk.ArgumentError`` before anything reaches Redis, whatever verb it came
through. A score of ``inf`` or 1e300, or a payload whose ``at`` or
``enqueued_at`` is ``inf``, huge or a string, written by another client,
still lists, shows and deletes in ``wurk scheduled|retries|dead`` and the
dashboard, and a due member's hostile ``at`` neither stops the poller nor
sends the job to dead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli
from starlette.testclient import TestClient

import wurk
import wurk.api
import wurk.web
from wurk.api.paging import parse_entry_key
from wurk.runtime.scheduled import Poller
from wurk.settings.config import Config

cli = admin_cli.cli
keep_logging = admin_cli.keep_logging
SETS = {"scheduled": "schedule", "retries": "retry", "dead": "dead"}
BAD_TIMES: list[Any] = [math.inf, -math.inf, math.nan, 1e308, 10**400, -(10**400), 2e11]
# What another client may leave: (jid, score, payload fields).
HOSTILE = [("score-inf", "inf", {}), ("score-ninf", "-inf", {}), ("score-huge", "1e300", {}),
           ("at-inf", "1700000000", {"at": 1e308, "enqueued_at": 1e308}),
           ("at-str", "1700000000", {"at": "x", "enqueued_at": "soon", "created_at": "x"}),
           ("at-bool", "1700000000", {"at": True, "failed_at": 10**30}),
           ("at-neg", "1700000000", {"at": -5, "retried_at": -1e308}),
           # Python's json writes (and reads) these as the literals Infinity and NaN.
           ("at-literal", "1700000000", {"at": math.inf, "enqueued_at": -math.inf,
                                         "failed_at": math.nan, "created_at": math.inf})]


@pytest.fixture
def job(config: Config) -> Iterator[wurk.JobFunction[..., Any]]:
    @wurk.job(name="HostileTimesJob")
    def hostile_times_job(value: int) -> None:
        pass

    yield hostile_times_job
    wurk.registry.discard("HostileTimesJob")


def nothing_written(r: redis.Redis) -> None:
    assert r.keys("*") == []


@pytest.mark.parametrize("bad", BAD_TIMES, ids=lambda bad: repr(bad)[:12])
def test_every_sync_verb_refuses_a_time_no_clock_reaches(
        r: redis.Redis, config: Config, job: wurk.JobFunction[..., Any], bad: Any) -> None:
    client = wurk.Client(config)
    verbs: list[Callable[[], object]] = [
        lambda: job.perform_in(bad, 1), lambda: job.perform_at(bad, 1),
        lambda: job.set(queue="q").perform_in(bad, 1),
        lambda: client.push({"class": "HostileTimesJob", "args": [1], "at": bad}),
        lambda: client.push_bulk({"class": "HostileTimesJob", "args": [[1], [2]], "at": bad}),
        lambda: client.push_bulk({"class": "HostileTimesJob", "args": [[1], [2]],
                                  "at": [time.time() + 60, bad]}),
    ]
    for verb in verbs:
        with pytest.raises(wurk.ArgumentError, match="finite"):
            verb()
    nothing_written(r)


@pytest.mark.parametrize("bad", [True, "tomorrow", {}, [1]], ids=repr)
def test_a_time_that_is_not_a_number_is_an_argument_error(
        r: redis.Redis, config: Config, job: wurk.JobFunction[..., Any], bad: Any) -> None:
    for verb in (lambda: job.perform_in(bad, 1), lambda: job.perform_at(bad, 1)):
        with pytest.raises(wurk.ArgumentError):
            verb()
    nothing_written(r)


def test_a_bulk_with_one_bad_time_among_thousands_pushes_nothing(
        r: redis.Redis, config: Config, job: wurk.JobFunction[..., Any]) -> None:
    ats: list[Any] = [time.time() + 60] * 2500
    ats[2200] = math.inf
    with pytest.raises(wurk.ArgumentError, match=r"at\[2200\]"):
        wurk.Client(config).push_bulk({"class": "HostileTimesJob",
                                       "args": [[n] for n in range(2500)], "at": ats})
    nothing_written(r)


@pytest.mark.parametrize("bad", [math.inf, math.nan, 1e300], ids=repr)
def test_the_async_verbs_refuse_it_too(r: redis.Redis, config: Config,
                                       job: wurk.JobFunction[..., Any], bad: Any) -> None:
    async def push() -> None:
        for verb in (lambda: job.aperform_in(bad, 1), lambda: job.aperform_at(bad, 1)):
            with pytest.raises(wurk.ArgumentError):
                await verb()
        with pytest.raises(wurk.ArgumentError):
            await wurk.AsyncClient(config).push({"class": "HostileTimesJob", "args": [1],
                                                 "at": bad})

    asyncio.run(push())
    nothing_written(r)


def test_good_times_still_schedule(r: redis.Redis, config: Config,
                                   job: wurk.JobFunction[..., Any]) -> None:
    job.perform_in(30, 1)
    job.perform_at(datetime(3000, 1, 1, tzinfo=UTC), 2)
    job.perform_in(-5, 3)  # already past: runs now, as Sidekiq's
    scores = sorted(s for _, s in r.zrange("schedule", 0, -1, withscores=True))
    assert len(scores) == 2 and scores[1] == datetime(3000, 1, 1, tzinfo=UTC).timestamp()
    assert r.llen("queue:default") == 1


def write_hostile(r: redis.Redis, key: str) -> None:
    for jid, score, fields in HOSTILE:
        payload = {"class": "Ruby::Job", "args": [jid], "jid": jid, "queue": "default",
                   "retry": True, **fields}
        if key != "schedule":
            payload.update(error_class="E", error_message="m", retry_count=1)
        r.execute_command("ZADD", key, score, json.dumps(payload))


@pytest.mark.parametrize("command", SETS)
def test_the_cli_lists_shows_and_deletes_entries_with_hostile_times(
        cli: Cli, r: redis.Redis, command: str) -> None:
    write_hostile(r, SETS[command])
    listed = cli(command, "list")
    assert listed.code == 0, listed.err
    for jid, _, _ in HOSTILE:
        assert jid in listed.out
    assert "inf (not a time)" in listed.out and "1e+300 (not a time)" in listed.out
    as_json = cli("--json", command, "list")
    assert as_json.code == 0, as_json.err
    # Strict JSON: no Infinity or NaN a parser other than Python's would refuse.
    document = json.loads(as_json.out, parse_constant=pytest.fail)
    assert {e["jid"]: e["at"] for e in document["entries"]}["score-inf"] is None
    jids = [jid for jid, _, _ in HOSTILE]
    shown = cli(command, "show", *jids)
    assert shown.code == 0, shown.err
    assert all(jid in shown.out for jid in jids)
    shown_json = cli("--json", command, "show", *jids)
    assert shown_json.code == 0, shown_json.err
    json.loads(shown_json.out, parse_constant=pytest.fail)
    deleted = cli(command, "delete", *jids, "--yes")
    assert deleted.code == 0, deleted.err
    assert r.zcard(SETS[command]) == 0


@pytest.fixture
def web(config: Config) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def entry_keys(page: str) -> list[str]:
    return re.findall(r'name="key" value="([^"]+)"', page)


@pytest.mark.parametrize("slug", SETS)
def test_the_dashboard_lists_shows_and_deletes_entries_with_hostile_times(
        web: TestClient, r: redis.Redis, slug: str) -> None:
    write_hostile(r, SETS[slug])
    listing = web.get(f"/{slug}")
    assert listing.status_code == 200
    keys = entry_keys(listing.text)
    assert len(keys) == len(HOSTILE)
    for start in ("inf-score-inf", "-inf-score-ninf", "1e+300-score-huge"):
        assert start in keys, keys
    csrf = re_csrf(listing.text)
    for key in keys:
        page = web.get(f"/{slug}/{key}")
        assert page.status_code == 200, (key, page.text[:300])
        web.post(f"/{slug}/{key}", data={"csrf": csrf, "action": "delete"})
    assert r.zcard(SETS[slug]) == 0


def re_csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


@pytest.mark.parametrize("reliable", [True, False], ids=["promote-script", "classic"])
def test_the_poller_moves_due_members_whatever_their_at_says(
        r: redis.Redis, config: Config, reliable: bool) -> None:
    for key in ("retry", "schedule"):
        for n, at in enumerate(["x", 1e308, -5, True, None, {"a": 1}, time.time() + 3600]):
            payload = {"class": "Ruby::Job", "args": [n], "jid": f"{key}-{n}",
                       "queue": "default", "retry": True, "at": at}
            r.zadd(key, {json.dumps(payload): time.time() - 10})
    poller = Poller(dataclasses.replace(config, reliable_scheduler=reliable))
    assert poller.enqueue_due() == 14
    assert (r.zcard("retry"), r.zcard("schedule"), r.zcard("dead")) == (0, 0, 0)
    moved = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]
    assert len(moved) == 14 and not any("at" in job for job in moved)


def test_reschedule_refuses_a_time_no_clock_reaches(r: redis.Redis, config: Config,
                                                    job: wurk.JobFunction[..., Any]) -> None:
    job.perform_in(60, 1)
    [entry] = wurk.api.ScheduledSet(config=config)
    for bad in (math.inf, math.nan, 1e300):
        with pytest.raises(wurk.ArgumentError):
            entry.reschedule(bad)
    assert entry.reschedule(time.time() + 120)
    assert math.isfinite(r.zrange("schedule", 0, -1, withscores=True)[0][1])


def test_queue_listings_and_stats_take_a_queued_job_stamped_at_infinity(
        cli: Cli, r: redis.Redis) -> None:
    r.sadd("queues", "default")
    r.lpush("queue:default", json.dumps({"class": "Ruby::Job", "args": [], "jid": "q1",
                                         "queue": "default", "enqueued_at": -math.inf,
                                         "created_at": math.nan}))
    for argv in (["queues"], ["stats"], ["--json", "queues"], ["--json", "stats"]):
        done = cli(*argv)
        assert done.code == 0, (argv, done.err)
        if argv[0] == "--json":
            json.loads(done.out, parse_constant=pytest.fail)


@pytest.mark.parametrize("score", [math.inf, -math.inf, 1e300, -1e300])
def test_entry_keys_of_scores_no_clock_reaches_round_trip(score: float) -> None:
    assert parse_entry_key(f"{score!r}-ab-cd") == (score, "ab-cd")

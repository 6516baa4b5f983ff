"""wurk.api.paging: pages and searches that never read a big key whole."""

from __future__ import annotations

import json

import pytest
import redis

import wurk
from wurk.api import DeadSet, Queue, RetrySet
from wurk.api.paging import (
    entry_key,
    find_entry,
    parse_entry_key,
    queue_page,
    search_set,
    set_page,
)
from wurk.settings.config import Config


def test_queue_pages_run_newest_first_with_the_total(config: Config) -> None:
    client = wurk.Client(config)
    for n in range(7):
        client.push({"class": "Job", "args": [n], "queue": "q"})
    first = queue_page(Queue("q", config=config), 1, 3)
    last = queue_page(Queue("q", config=config), 3, 3)
    assert [job.args[0] for job in first.items] == [6, 5, 4]
    assert [job.args[0] for job in last.items] == [0]
    assert (first.total, first.pages, last.first_index) == (7, 3, 6)
    assert queue_page(Queue("q", config=config), 9, 3).items == []


@pytest.mark.parametrize(("number", "per_page"), [(0, 10), (1, 0), (1, 501)])
def test_bad_page_arguments_are_refused(config: Config, number: int, per_page: int) -> None:
    with pytest.raises(ValueError, match="page"):
        queue_page(Queue("q", config=config), number, per_page)


def _fill(r: redis.Redis, name: str, count: int) -> None:
    r.zadd(name, {json.dumps({"class": f"C{n}", "jid": f"jid{n:03d}", "args": [n],
                              "queue": "default"}): 1000 + n for n in range(count)})


def test_set_pages_go_by_index_in_either_order(config: Config, r: redis.Redis) -> None:
    _fill(r, "dead", 12)
    dead = DeadSet(config=config)
    asc = set_page(dead, 2, 5)
    desc = set_page(dead, 1, 5, descending=True)
    assert [e.jid for e in asc.items] == [f"jid{n:03d}" for n in range(5, 10)]
    assert [e.jid for e in desc.items] == [f"jid{n:03d}" for n in range(11, 6, -1)]
    assert asc.total == 12 and asc.pages == 3


def test_search_finds_by_class_jid_and_args_and_stops_at_the_limit(
        config: Config, r: redis.Redis) -> None:
    _fill(r, "retry", 3000)
    retries = RetrySet(config=config)
    assert search_set(retries, "jid9999") == ([], False)
    by_jid, truncated = search_set(retries, "jid042")
    assert [e.jid for e in by_jid] == ["jid042"] and not truncated
    by_class, _ = search_set(retries, '"C7"')
    assert [e.klass for e in by_class] == ["C7"]
    some, truncated = search_set(retries, "jid", limit=100)
    assert truncated and len(some) == 100  # the first 100, never a scan step more
    assert [e.score for e in some] == sorted(e.score for e in some)
    with pytest.raises(ValueError, match="empty"):
        search_set(retries, "")


def test_a_glob_metacharacter_in_a_search_stays_literal(config: Config, r: redis.Redis) -> None:
    r.zadd("dead", {json.dumps({"class": "A", "args": ["a[1]"], "jid": "j1"}): 1,
                    json.dumps({"class": "B", "args": ["a1"], "jid": "j2"}): 2})
    found, _ = search_set(DeadSet(config=config), "a[1]")
    assert [e.jid for e in found] == ["j1"]


def test_star_and_question_mark_are_the_two_wildcards(config: Config, r: redis.Redis) -> None:
    r.zadd("dead", {json.dumps({"class": "A", "args": ["ab1"], "jid": "j1"}): 1,
                    json.dumps({"class": "B", "args": ["a?1"], "jid": "j2"}): 2,
                    json.dumps({"class": "C", "args": ["axx1"], "jid": "j3"}): 3})
    dead = DeadSet(config=config)
    assert [e.jid for e in search_set(dead, "a?1")[0]] == ["j1", "j2"]
    assert [e.jid for e in search_set(dead, "a*1")[0]] == ["j1", "j2", "j3"]
    # A pattern without a leading or trailing * still means "contains".
    assert [e.jid for e in search_set(dead, '"C*"')[0]] == ["j3"]


@pytest.mark.parametrize("score", [1764543210.123456, 0.0, -5.5, 1e-05, 1e20])
def test_entry_keys_round_trip(score: float) -> None:
    assert parse_entry_key(f"{score!r}-ab-cd") == (score, "ab-cd")


@pytest.mark.parametrize("key", ["", "nodash", "abc-jid", "inf-jid", "nan-x"])
def test_bad_entry_keys_find_nothing(config: Config, key: str) -> None:
    assert find_entry(DeadSet(config=config), key) is None


def test_find_entry_picks_the_jid_among_equal_scores(config: Config, r: redis.Redis) -> None:
    r.zadd("retry", {json.dumps({"class": "A", "jid": "one", "args": []}): 5.25,
                     json.dumps({"class": "B", "jid": "two", "args": []}): 5.25})
    retries = RetrySet(config=config)
    entry = find_entry(retries, "5.25-two")
    assert entry is not None and entry.klass == "B"
    assert entry_key(entry) == "5.25-two"
    assert entry.delete()
    assert find_entry(retries, "5.25-two") is None


def test_redis_info_reads_the_dashboard_fields(config: Config) -> None:
    from wurk.api import redis_info

    info = redis_info(config=config)
    assert info["redis_version"].split(".")[0].isdigit()
    assert int(info["connected_clients"]) >= 1 and int(info["uptime_in_seconds"]) >= 0
    assert "used_memory_human" in info and "executable" not in info

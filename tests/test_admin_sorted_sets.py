"""``wurk retries``, ``dead`` and ``scheduled``: list the sorted sets, move
jobs back to their queue, delete and clear; unknown jids are named and
nothing moves.

The commands run in process (the ``cli`` fixture of tests/admin_cli.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli, columns
from test_api_support import job_json

import wurk
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def failed(jid: str, retry_count: int = 2) -> str:
    return job_json(jid, error_class="RuntimeError", error_message="boom",
                    failed_at=time.time() - 5, retry_count=retry_count)


def queued(r: redis.Redis, queue: str = "default") -> dict[str, dict[str, Any]]:
    return {item["jid"]: item for item in map(json.loads, r.lrange(f"queue:{queue}", 0, -1))}


def test_retries_list_retry_delete_clear(cli: Cli, r: redis.Redis) -> None:
    now = time.time()
    r.zadd("retry", {failed("a"): now + 30, failed("b"): now + 10, failed("c"): now + 20})

    listed = cli("retries", "--json").json
    assert (listed["set"], listed["size"]) == ("retry", 3)
    assert [e["jid"] for e in listed["entries"]] == ["b", "c", "a"]  # soonest first
    assert listed["entries"][0] == {
        "jid": "b", "handle": "b", "class": "WurkEcho", "queue": "default", "args": [1],
        "at": pytest.approx(now + 10), "retry_count": 2, "error_class": "RuntimeError",
        "error_message": "boom"}
    lines = cli("retries", "list").lines
    assert columns(lines[0]) == ["JID", "CLASS", "QUEUE", "NEXT TRY", "RETRIES", "ERROR",
                                 "ARGS"]
    assert columns(lines[1])[:3] == ["b", "WurkEcho", "default"]
    assert columns(lines[1])[3].startswith("in ")
    assert "RuntimeError: boom" in lines[1]

    moved = cli("retries", "retry", "a", "--json")
    assert moved.code == 0, moved.err
    assert moved.json == {"set": "retry", "action": "retry", "count": 1, "jids": ["a"]}
    assert queued(r)["a"]["retry_count"] == 1  # Sidekiq's retry decrements it
    assert sorted(json.loads(str(m))["jid"] for m in r.zrange("retry", 0, -1)) == ["b", "c"]

    deleted = cli("retries", "delete", "b", "--yes")
    assert deleted.lines == ["deleted 1 job from the retry set: b"]
    assert "b" not in queued(r)
    assert r.zcard("retry") == 1

    cleared = cli("retries", "clear", "--yes", "--json")
    assert cleared.json == {"set": "retry", "action": "clear", "count": 1, "jids": None}
    assert r.zcard("retry") == 0
    assert cli("retries").lines == ["the retry set is empty"]


def test_dead_and_scheduled_moves(cli: Cli, config: Config, r: redis.Redis) -> None:
    now = time.time()
    r.zadd("dead", {failed("old", 5): now - 100, failed("new", 5): now - 10})
    listed = cli("dead", "--json", "--limit", "1").json
    assert (listed["size"], [e["jid"] for e in listed["entries"]]) == (2, ["new"])
    human = cli("dead", "--limit", "1").lines
    assert columns(human[0])[3] == "DIED" and columns(human[1])[3].endswith(" ago")
    assert human[-1] == "(1 of 2 shown; --limit 0 shows all)"

    everything = cli("dead", "retry", "--all", "--json").json
    assert (everything["count"], sorted(everything["jids"])) == (2, ["new", "old"])
    assert r.zcard("dead") == 0
    assert {jid: item["retry_count"] for jid, item in queued(r).items()} == {"new": 4,
                                                                           "old": 4}

    jid = wurk.Client(config).push({"class": "Later", "args": [1], "queue": "mail",
                                    "at": now + 600})
    ran = cli("scheduled", "retry", jid)
    assert ran.lines == [f"queued now 1 job from the schedule set: {jid}"]
    item = queued(r, "mail")[jid]
    assert "at" not in item and "retry_count" not in item
    assert r.zcard("schedule") == 0


def test_unknown_jids_are_named_and_nothing_moves(cli: Cli, r: redis.Redis) -> None:
    r.zadd("retry", {failed("a"): time.time() + 10})
    result = cli("retries", "retry", "a", "nope", "zilch")
    assert result.code == 1
    assert result.err == "wurk: no jobs with jids 'nope', 'zilch' in the 'retry' set\n"
    assert result.out == ""
    assert r.zcard("retry") == 1 and r.llen("queue:default") == 0

    single = cli("dead", "delete", "ghost")
    assert (single.code, single.err) == (1, "wurk: no job with jid 'ghost' in the 'dead' set\n")
    assert cli("scheduled", "retry", "ghost").code == 1

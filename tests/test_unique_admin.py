"""The locks of unique jobs in the admin API (wurk.api.UniqueLocks) and the
admin CLI (``wurk unique``), against a real redis-server."""

from __future__ import annotations

from typing import Any

import admin_cli
import redis
from admin_cli import Cli

from wurk.api import UniqueLocks
from wurk.push.client import Client
from wurk.settings.config import Config
from wurk.unique.keys import lock_key

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def push(config: Config, *args: Any, **extra: Any) -> str | None:
    return Client(config).push({"class": "Feed", "args": list(args), "unique_for": 60,
                                **extra})


def test_the_api_names_the_holder_lists_locks_and_releases_one(
        config: Config, r: redis.Redis) -> None:
    locks = UniqueLocks(config=config)
    jid = push(config, 7)
    assert locks.holder("Feed", [7]) == jid
    assert locks.holder("Feed", [8]) is None
    assert locks.holder("Feed", [7], queue="other") is None
    r.hset(lock_key("Feed", "default", ["garbage"]), "a", "hash")
    listed = {lock.key: lock for lock in locks.locks()}
    assert listed[lock_key("Feed", "default", [7])].holder == jid
    assert 0 < listed[lock_key("Feed", "default", [7])].ttl_ms <= 60_000
    garbage = listed[lock_key("Feed", "default", ["garbage"])]
    assert (garbage.holder, garbage.ttl_ms) == ("", -1)
    assert locks.release("Feed", [7]) is True
    assert locks.release("Feed", [7]) is False
    assert push(config, 7) is not None


def test_wurk_unique_lists_shows_and_releases(cli: Cli, config: Config, r: redis.Redis) -> None:
    jid = push(config, {"b": 1, "a": 2})
    key = lock_key("Feed", "default", [{"a": 2, "b": 1}])
    listed = cli("unique", "--json")
    assert listed.code == 0, listed.err
    [lock] = listed.json["locks"]
    assert (lock["key"], lock["holder"]) == (key, jid) and lock["ttl_ms"] > 0
    assert key in cli("unique").out
    shown = cli("unique", "show", "Feed", '[{"a": 2, "b": 1}]', "--json")
    assert shown.code == 0 and shown.json["lock"]["holder"] == jid
    assert cli("unique", "show", "Feed", "[3]").code == 1
    assert "not held" in cli("unique", "show", "Feed", "[3]").out
    assert cli("unique", "show", "Feed", "{}").code == 2
    assert cli("unique", "show", "Feed", "not json").code == 2
    assert cli("unique", "show").code == 2
    refused = cli("unique", "release", "Feed", '[{"b": 1, "a": 2}]')
    assert refused.code == 2 and "--yes" in refused.err and r.exists(key)
    released = cli("unique", "release", "Feed", '[{"b": 1, "a": 2}]', "--yes", "--json")
    assert released.code == 0 and released.json == {"key": key, "released": True}
    assert not r.exists(key)
    assert "no unique-job locks" in cli("unique").out

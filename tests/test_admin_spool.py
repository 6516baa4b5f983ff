"""``wurk spool``: list the spool files with their counts, ages and jids,
push them now (bad files reported and moved aside), discard them only with
``--yes``.

The commands run in process (the ``cli`` fixture of tests/admin_cli.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import admin_cli
import pytest
import redis
from admin_cli import Cli
from conftest import RedisServer
from test_spool import make_entries

from wurk.push import spool
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def spooled_file(url: str, count: int) -> tuple[Path, list[str]]:
    """A spool file, as an exiting process writes it, for the Redis at ``url``."""
    config = Config(redis_url=url)
    entries = make_entries(count)
    path = spool.write_spool(spool.spool_dir(config), spool.target_of(config), entries)
    return path, [e.jid for e in entries]


def test_spool_list_shows_files_counts_ages_and_jids(cli: Cli, redis_server: RedisServer) -> None:
    path, jids = spooled_file(redis_server.url, 3)
    bad = path.with_name(f"{time.time_ns():020d}-1-abcdef.spool")
    bad.write_text("not json\n")
    result = cli("spool", "--json")
    assert result.code == 0, result.err
    doc = result.json
    assert doc["directory"] == str(path.parent)
    assert doc["target"] == f"redis://127.0.0.1:{redis_server.port}/0"
    first, second = doc["files"]
    assert first["file"] == path.name and first["state"] == "waiting" and first["jobs"] == 3
    assert first["jids"] == jids and 0 <= first["age"] < 60 and first["error"] is None
    assert first["written_by"] == os.getpid() and first["target"] == doc["target"]
    assert second["file"] == bad.name and second["error"] == "line 1: not JSON"
    table_out = cli("spool").out
    assert path.name in table_out and "waiting" in table_out


def test_spool_push_pushes_now_and_reports_bad_files(
        cli: Cli, redis_server: RedisServer, r: redis.Redis) -> None:
    path, jids = spooled_file(redis_server.url, 4)
    bad = path.with_name(f"{time.time_ns():020d}-1-abcdef.spool")
    bad.write_text("[]\n")
    result = cli("spool", "push", "--json")
    assert result.code == 1 and bad.name in result.err
    doc = result.json
    assert doc["pushed"] == [{"file": path.name, "jobs": 4, "jids": jids}]
    assert doc["bad"] == [{"file": f"{bad.name}.bad", "error": "line 1: not a JSON object"}]
    assert [json.loads(raw)["jid"] for raw in reversed(r.lrange("queue:spooled", 0, -1))] == jids
    assert cli("spool", "push", "--json").json["pushed"] == []  # once only


def test_spool_discard_asks_unless_yes(cli: Cli, redis_server: RedisServer,
                                       r: redis.Redis) -> None:
    path, jids = spooled_file(redis_server.url, 2)
    refused = cli("spool", "discard", "--all")
    assert refused.code == 2 and "--yes" in refused.err and path.exists()
    assert cli("spool", "discard", "nosuch.spool", "--yes").code == 1
    result = cli("spool", "discard", path.name, "--yes", "--json")
    assert result.code == 0, result.err
    assert result.json["discarded"] == [{"file": path.name, "jobs": 2, "jids": jids, "released": 0}]
    assert not path.exists() and r.llen("queue:spooled") == 0

"""The ``wurk`` admin command line itself (docs/reference/admin-cli.md): exit codes for
arguments that do not fit, bad config and an unreachable Redis; global
options on either side of the command; the command registry as the
extension point; a docs section per command; the output helpers.

Most tests run ``wurk.cli.main`` in process (the ``cli`` fixture of
tests/admin_cli.py); one runs the real ``wurk`` entry point. Each group of
commands has its own module: test_admin_listing.py, test_admin_sorted_sets.py,
test_admin_show.py, test_admin_confirm.py, test_admin_control.py,
test_admin_spool.py; swarm-level control is in test_swarm_control.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import admin_cli
import pytest
import redis
from admin_cli import Cli
from conftest import RedisServer, free_port

from wurk import admin
from wurk.admin.output import duration, table, when
from wurk.admin.registry import AdminCommand, Context, Registry

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


@pytest.mark.parametrize("argv", [
    ["retries", "retry"], ["retries", "delete", "a", "--all"], ["retries", "list", "a"],
    ["dead", "clear", "a"], ["dead", "--limit", "-1"], ["quiet"], ["stop", "x", "--all"],
    ["restart"], ["quiet", "x", "--swarm", "y"],
], ids=" ".join)
def test_arguments_that_do_not_fit_exit_2(cli: Cli, argv: list[str]) -> None:
    result = cli(*argv)
    assert result.code == 2
    assert result.err.startswith(f"wurk {argv[0]}: ")
    assert result.out == ""


def test_argparse_errors_exit_2(cli: Cli) -> None:
    assert cli("retries", "bogus").code == 2
    assert cli("dump", "--all").code == 2  # dump names processes, never everyone
    assert cli("restart", "some-identity").code == 2


def test_config_errors_exit_78(cli: Cli, tmp_path: Path) -> None:
    missing = cli("-C", str(tmp_path / "missing.toml"), "stats")
    assert missing.code == 78 and "cannot read" in missing.err
    bad = tmp_path / "bad.toml"
    bad.write_text('[wurk]\nconcurrency = "lots"\n')
    typed = cli("stats", "--config", str(bad))
    assert typed.code == 78
    assert typed.err.startswith("wurk: ") and "concurrency must be int" in typed.err
    url = cli("stats", "--redis-url", "http://example.com")
    assert url.code == 78 and "redis_url must start with" in url.err


def test_redis_unreachable_is_one_clear_line(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WURK_", "REDIS_URL"))}
    env["PYTHONPATH"] = str(REPO)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "wurk.cli", "stats", "--redis-url",
         f"redis://:s3cret@127.0.0.1:{port}/0"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30, check=False)
    assert proc.returncode == 1
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"wurk: cannot reach Redis at redis://:***@127.0.0.1:{port}/0: ")
    assert "s3cret" not in proc.stderr
    assert time.monotonic() - started < 15


def test_global_options_go_before_or_after_the_command(cli: Cli, r: redis.Redis) -> None:
    r.set("stat:processed", 3)
    assert cli("--json", "stats").json["processed"] == 3
    assert cli("stats", "--json").json["processed"] == 3
    refused = cli("--json", "run")
    assert refused.code == 2 and "has no --json" in refused.err


def test_the_registry_is_the_extension_point(redis_server: RedisServer,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def run(ctx: Context, args: argparse.Namespace) -> None:
        ctx.emit({"url": ctx.config.redis_url, "name": args.name},
                 lambda payload, now: [f"hello {payload['name']}"])

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    registry = Registry(AdminCommand("hello", "say hello", run, arguments))
    with pytest.raises(ValueError, match="hello"):
        registry.add(AdminCommand("hello", "again", run))
    with pytest.raises(ValueError, match="run"):
        registry.add(AdminCommand("run", "clash", run))
    parser = argparse.ArgumentParser(prog="wurk")
    admin.add_global_options(parser)
    registry.install(parser.add_subparsers(dest="command"))

    args = parser.parse_args(["hello", "you", "--json", "--redis-url", redis_server.url])
    assert admin.run(args) == 0
    assert json.loads(capsys.readouterr().out) == {"url": redis_server.url, "name": "you"}
    assert admin.run(parser.parse_args(["--redis-url", redis_server.url, "hello", "me"])) == 0
    assert capsys.readouterr().out == "hello me\n"


def test_every_command_has_a_section_in_the_docs() -> None:
    page = REPO / "docs" / "reference" / "admin-cli.md"
    headings = [line for line in page.read_text().splitlines() if line.startswith("## ")]
    names = [command.name for command in admin.REGISTRY]
    assert {"stats", "queues", "processes", "workers", "swarms", "retries", "dead",
            "scheduled", "pause", "unpause", "quiet", "stop", "restart", "dump"} <= set(names)
    for name in names:
        assert any(re.search(rf"\bwurk {name}\b", h) for h in headings), name


def test_table_aligns_columns_and_says_when_empty() -> None:
    lines = table(("A", "LONGER", "C"), [("xyz", 1, "end"), ("q", 22222222, "")], empty="none")
    assert lines == ["A    LONGER    C", "xyz  1         end", "q    22222222"]
    assert table(("A",), [], empty="nothing here") == ["nothing here"]


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (0.4, "0s"), (42, "42s"), (192, "3m 12s"), (3600, "1h"), (7500, "2h 5m"),
    (3 * 86400 + 4 * 3600 + 5, "3d 4h"), (-90, "1m 30s"),
])
def test_duration(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_when() -> None:
    assert when(1000.0, now=1012.0) == "12s ago"
    assert when(1250.0, now=1000.0) == "in 4m 10s"
    assert when(None, now=1000.0) == when(0.0, now=1000.0) == "-"

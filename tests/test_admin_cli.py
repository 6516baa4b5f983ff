"""The ``wurk`` admin commands against a real Redis (docs/reference/admin-cli.md).

Most tests run ``wurk.cli.main`` in process and read stdout/stderr; the
processes they steer are real (an in-process Launcher, a ``wurk run``
subprocess). Swarm-level control is in test_swarm_control.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
import test_cli
from conftest import RedisServer, free_port
from test_api_support import job_json, launched, recording_job, ruby_heartbeat
from test_spool import make_entries
from waiting import wait_for

import wurk
from supervisor.remote import RemoteControl, SwarmSnapshot
from wurk import admin
from wurk.admin.output import duration, table, when
from wurk.admin.registry import AdminCommand, Context, Registry
from wurk.cli import main
from wurk.core import logging as wlog
from wurk.push import spool
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """Logs to fd 2, never into the captured stdout; restored for later tests, since
    the CLI configures structlog for errors only."""
    saved = structlog.get_config()
    wlog.setup("warning", "json")
    yield
    structlog.configure(**saved)


@pytest.fixture
def cli(redis_server: RedisServer, r: redis.Redis, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``wurk --redis-url <test redis> ARGS...`` in process."""
    def run(*argv: str) -> Result:
        capsys.readouterr()
        try:
            code = main(["--redis-url", redis_server.url, *argv])
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Result(code, out, err)
    return run


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def field_lines(out: str) -> dict[str, str]:
    """``name  value`` lines (names may hold single spaces) as a dict."""
    return {name: value for name, value in (columns(line) for line in out.splitlines())}


def swarm_control(config: Config, children: list[str], **slots: int) -> RemoteControl:
    """A registered swarm, written by the parent's own code (supervisor.remote)."""
    control = RemoteControl(config, Path("topology.toml"), lambda name: None)
    control.refresh(SwarmSnapshot(slots=slots, children=children, state="running"))
    return control


# -- stats, queues, processes, workers, swarms -------------------------------------

def test_stats_shows_the_clusters_figures(cli: Cli, config: Config, r: redis.Redis) -> None:
    r.set("stat:processed", 120)
    r.set("stat:failed", 7)
    client = wurk.Client(config)
    for n in range(3):
        client.push({"class": "A", "args": [n]})
    for n in range(2):
        client.push({"class": "M", "args": [n], "queue": "mail"})
    client.push({"class": "Later", "args": [], "at": time.time() + 300})
    r.zadd("retry", {job_json("r1"): time.time() + 10, job_json("r2"): time.time() + 20})
    r.zadd("dead", {job_json("d1"): time.time()})
    ruby_heartbeat(r, "web-1:1:aaaaaaaaaaaa", {"hostname": "web-1", "pid": 1}, busy=1)
    ruby_heartbeat(r, "web-2:2:bbbbbbbbbbbb", {"hostname": "web-2", "pid": 2}, busy=2)
    r.sadd("processes", "gone:3:cccccccccccc")  # crashed: no heartbeat hash

    result = cli("stats", "--json")
    assert result.code == 0, result.err
    figures = result.json
    latency = figures.pop("default_queue_latency")
    assert figures == {"processed": 120, "failed": 7, "enqueued": 5, "scheduled": 1,
                       "retries": 2, "dead": 1, "processes": 2, "busy": 3}
    assert 0 <= latency < 5

    human = cli("stats")
    shown = field_lines(human.out)
    assert (shown["processed"], shown["failed"], shown["enqueued"]) == ("120", "7", "5")
    assert (shown["scheduled"], shown["retries"], shown["dead"]) == ("1", "2", "1")
    assert (shown["processes"], shown["busy"]) == ("2", "3")
    assert shown["default queue latency"].endswith("s")


def test_queues_lists_size_latency_and_paused(cli: Cli, r: redis.Redis) -> None:
    old = time.time() - 30
    for n in range(2):
        r.lpush("queue:default", json.dumps({"class": "A", "args": [n], "jid": new_jid(),
                                              "queue": "default", "enqueued_at": old + n}))
    r.lpush("queue:mail", job_json(queue="mail", enqueued_at=time.time()))
    r.sadd("queues", "default", "mail", "critical")
    r.sadd("paused", "mail")

    result = cli("queues", "--json")
    assert result.code == 0, result.err
    queues = result.json
    assert [(q["name"], q["size"], q["paused"]) for q in queues] == [
        ("critical", 0, False), ("default", 2, False), ("mail", 1, True)]
    latencies = {q["name"]: q["latency"] for q in queues}
    assert latencies["critical"] == 0
    assert 29 <= latencies["default"] < 40
    assert latencies["mail"] < 5

    lines = cli("queues").lines
    assert columns(lines[0]) == ["QUEUE", "SIZE", "LATENCY", "PAUSED"]
    size_at = lines[0].index("SIZE")
    rows = {columns(line)[0]: line for line in lines[1:]}
    assert set(rows) == {"critical", "default", "mail"}
    assert all(line[size_at:].split()[0] == str(n)
               for line, n in ((rows["critical"], 0), (rows["default"], 2), (rows["mail"], 1)))
    assert columns(rows["default"])[2].startswith("3")  # "30s" or "31s"
    assert rows["mail"].rstrip().endswith("paused")
    assert "paused" not in rows["default"]


def test_processes_and_workers_show_a_running_job(cli: Cli, config: Config) -> None:
    release = threading.Event()
    with recording_job(block=release) as (job, runs), launched(config) as launcher:
        jid = job.perform_async("x", 2)
        wait_for(lambda: cli("workers", "--json").json, timeout=10)

        [process] = cli("processes", "--json").json
        assert process["identity"] == launcher.identity
        assert (process["hostname"], process["pid"]) == (HOST, os.getpid())
        assert (process["concurrency"], process["busy"]) == (config.concurrency, 1)
        assert (process["queues"], process["quiet"], process["embedded"]) == (
            ["default"], False, False)
        assert (process["slot"], process["index"], process["swarm_pid"]) == (None, None, None)
        assert process["rss_kb"] > 1000 and process["beat"] == pytest.approx(time.time(), abs=5)

        [work] = cli("workers", "--json").json
        assert (work["process"], work["queue"], work["jid"]) == (launcher.identity, "default",
                                                                 jid)
        assert (work["class"], work["args"]) == (job.name, ["x", 2])
        assert work["run_at"] == pytest.approx(time.time(), abs=10)

        processes = cli("processes").lines
        assert columns(processes[0])[:6] == ["IDENTITY", "TAG", "SLOT", "QUEUES", "BUSY",
                                             "STATE"]
        row = columns(processes[1])
        assert row[0] == launcher.identity and row[4] == f"1/{config.concurrency}"
        assert row[5] == "running"
        workers = cli("workers").lines
        assert columns(workers[1])[:5] == [launcher.identity, work["thread"], "default",
                                           job.name, jid]
        release.set()
        wait_for(lambda: runs)
    assert cli("workers").lines == ["no jobs running"]
    assert cli("processes", "--json").json == []


def test_a_swarm_child_shows_its_tag_and_its_slot_apart(
        cli: Cli, config: Config, launch_with: Callable[..., Any]) -> None:
    tagged = dataclasses.replace(config, tag="reports")
    child = launch_with(tagged, extra_info={"slot": "heavy", "index": 1, "swarm_pid": 1})
    alone = launch_with(dataclasses.replace(config, tag=""))
    rows = {columns(line)[0]: columns(line) for line in cli("processes").lines[1:]}
    assert rows[child.identity][1:3] == ["reports", "heavy#1"]
    assert rows[alone.identity][1:3] == ["-", "-"]


def test_swarms_lists_live_swarms_and_prunes_expired_ones(cli: Cli, config: Config,
                                                          r: redis.Redis) -> None:
    control = swarm_control(config, ["h:10:aaaaaaaaaaaa", "h:11:bbbbbbbbbbbb"], alpha=2,
                            beta=1)
    r.sadd("wurk:swarms", "old:1:swarm-000000000000")  # its hash expired long ago

    [swarm] = cli("swarms", "--json").json
    assert swarm == {
        "identity": control.identity, "hostname": HOST, "pid": os.getpid(),
        "state": "running", "started_at": pytest.approx(time.time(), abs=10),
        "beat": pytest.approx(time.time(), abs=10),
        "topology": str(Path("topology.toml").absolute()),
        "slots": {"alpha": 2, "beta": 1},
        "children": ["h:10:aaaaaaaaaaaa", "h:11:bbbbbbbbbbbb"]}
    assert re.fullmatch(rf"{re.escape(HOST)}:{os.getpid()}:swarm-[0-9a-f]{{12}}",
                        control.identity)
    assert r.smembers("wurk:swarms") == {control.identity}  # pruned
    assert 0 < r.ttl(control.identity) <= 60

    lines = cli("swarms").lines
    assert columns(lines[0])[:4] == ["IDENTITY", "STATE", "SLOTS", "CHILDREN"]
    assert columns(lines[1])[:4] == [control.identity, "running", "alpha=2 beta=1", "2"]
    control.unregister()
    assert cli("swarms").lines == ["no live swarms"]
    assert cli("swarms", "--json").json == []


# -- the sorted sets -----------------------------------------------------------------

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
        "jid": "b", "class": "WurkEcho", "queue": "default", "args": [1],
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


# -- pause -------------------------------------------------------------------------

def test_pause_and_unpause_name_unknown_queues(cli: Cli, r: redis.Redis) -> None:
    r.sadd("queues", "default")
    result = cli("pause", "default", "nope")
    assert result.code == 1
    assert result.err == "wurk: unknown queue 'nope' (not in the 'queues' set)\n"
    assert r.smembers("paused") == set()  # checked all first: default was not paused
    assert cli("unpause", "nope").code == 1


def test_a_paused_queue_runs_its_job_only_after_unpause(cli: Cli, config: Config,
                                                        r: redis.Redis) -> None:
    r.sadd("queues", "default")
    paused = cli("pause", "default", "--json")
    assert paused.json == {"action": "pause", "queues": ["default"]}
    assert r.smembers("paused") == {"default"}
    with recording_job() as (job, runs), launched(config):
        job.perform_async("held")
        time.sleep(1.5)  # fetchers look at the paused set at least once a second
        assert runs == []
        assert r.llen("queue:default") == 1
        assert [q["paused"] for q in cli("queues", "--json").json] == [True]

        assert cli("unpause", "default").lines == ["unpaused 'default'"]
        wait_for(lambda: runs == [("held",)], timeout=10)
    assert r.smembers("paused") == set()


# -- remote control -----------------------------------------------------------------

def test_control_names_unknown_identities_and_sends_nothing(cli: Cli, config: Config,
                                                            r: redis.Redis) -> None:
    for command in ("quiet", "stop", "dump"):
        result = cli(command, "nope:1:000000000000")
        assert result.code == 1
        assert result.err == "wurk: no live process with identity 'nope:1:000000000000'\n"
    unknown = cli("stop", "--swarm", "nope:1:swarm-000000000000")
    assert unknown.code == 1
    assert unknown.err == "wurk: no live swarm with identity 'nope:1:swarm-000000000000'\n"

    control = swarm_control(config, [], alpha=1)
    mistaken = cli("stop", control.identity)
    assert mistaken.code == 1
    assert f"is a swarm, not a process: use --swarm {control.identity}" in mistaken.err
    assert r.keys("*-signals") == []


def test_embedded_processes_are_refused_by_name_and_skipped_by_all(cli: Cli,
                                                                   r: redis.Redis) -> None:
    embedded, plain = "web:5:eeeeeeeeeeee", "wrk:6:ffffffffffff"
    ruby_heartbeat(r, embedded, {"hostname": "web", "pid": 5, "embedded": True})
    ruby_heartbeat(r, plain, {"hostname": "wrk", "pid": 6})

    refused = cli("quiet", plain, embedded)
    assert refused.code == 1
    assert refused.err.startswith(f"wurk: can't quiet embedded process {embedded}")
    assert not r.exists(f"{plain}-signals")  # checked first: nobody was signalled

    everyone = cli("quiet", "--all", "--json")
    assert everyone.code == 0, everyone.err
    payload = everyone.json
    assert (payload["command"], payload["signal"]) == ("quiet", "TSTP")
    assert (payload["processes"], payload["swarms"]) == ([plain], [])
    assert [s["identity"] for s in payload["skipped"]] == [embedded]
    assert r.lrange(f"{plain}-signals", 0, -1) == ["TSTP"]
    assert not r.exists(f"{embedded}-signals")
    assert cli("dump", embedded).code == 0  # a thread dump is fine for anyone
    assert r.lrange(f"{embedded}-signals", 0, -1) == ["TTIN"]


def test_all_reaches_swarms_and_leaves_their_children_to_them(cli: Cli, config: Config,
                                                              r: redis.Redis) -> None:
    listed, unlisted, alone = "h:7:111111111111", "h:8:222222222222", "h:9:333333333333"
    control = swarm_control(config, [listed], alpha=2)
    swarm_info = {"hostname": HOST, "swarm_pid": os.getpid(), "slot": "alpha"}
    ruby_heartbeat(r, listed, {"pid": 7, **swarm_info, "index": 0})
    # Registered after the swarm's last beat: known by its swarm_pid.
    ruby_heartbeat(r, unlisted, {"pid": 8, **swarm_info, "index": 1})
    ruby_heartbeat(r, alone, {"hostname": "h", "pid": 9})

    stopped = cli("stop", "--all", "--json").json
    assert (stopped["processes"], stopped["swarms"]) == ([alone], [control.identity])
    assert r.lrange(f"{control.identity}-signals", 0, -1) == ["TERM"]
    assert r.lrange(f"{alone}-signals", 0, -1) == ["TERM"]
    assert not r.exists(f"{listed}-signals") and not r.exists(f"{unlisted}-signals")

    restarted = cli("restart", "--all")
    assert restarted.lines == [f"USR1 sent to swarm {control.identity}: restart every child, "
                               "one at a time at its next beat"]
    assert r.lrange(f"{control.identity}-signals", 0, -1) == ["USR1", "TERM"]
    assert r.ttl(f"{control.identity}-signals") > 0


@pytest.fixture
def wurk_run(redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> Iterator[
        Callable[..., test_cli.Worker]]:
    (tmp_path / "clijobs.py").write_text(test_cli.JOBS_MODULE)
    workers: list[test_cli.Worker] = []

    def start(*args: str) -> test_cli.Worker:
        worker = test_cli.Worker(list(args), test_cli.child_env(redis_server.url, tmp_path),
                                 tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def test_dump_quiet_and_stop_reach_a_wurk_run_process(
        cli: Cli, r: redis.Redis, wurk_run: Callable[..., test_cli.Worker]) -> None:
    worker = wurk_run("-r", "clijobs", "--log-level", "info", "-c", "2")
    identity = test_cli.registered_identity(r, worker)

    dumped = cli("dump", identity, "--json")
    assert dumped.json == {"command": "dump", "signal": "TTIN", "processes": [identity],
                           "swarms": [], "skipped": []}
    wait_for(lambda: any(e.get("event") == "thread.dump" for e in worker.events()),
             timeout=10)

    quieted = cli("quiet", identity)
    assert quieted.lines == [f"TSTP sent to process {identity}: quiet (take no new jobs) "
                             "at its next heartbeat"]
    # The heartbeat is 0.2 s; the deadline is generous for a loaded machine.
    wait_for(lambda: r.hget(identity, "quiet") == "true", timeout=5)
    test_cli.push(r, "cli_echo", "late")
    time.sleep(1.0)
    assert r.llen("cli:done") == 0 and r.llen("queue:default") == 1

    assert cli("stop", identity).code == 0
    assert worker.wait(15) == 0, worker.stderr()
    assert r.smembers("processes") == set()
    assert r.llen("queue:default") == 1  # a quiet process never took it
    assert any(e.get("event") == "heartbeat.signal" and e.get("signal") == "TERM"
               for e in worker.events())


# -- config, Redis and options --------------------------------------------------------

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


# -- output helpers -------------------------------------------------------------------

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


def test_signals_sent_by_name_expire(cli: Cli, r: redis.Redis) -> None:
    ruby_heartbeat(r, "wrk:6:ffffffffffff", {"hostname": "wrk", "pid": 6})
    assert cli("stop", "wrk:6:ffffffffffff").code == 0
    assert r.lrange("wrk:6:ffffffffffff-signals", 0, -1) == ["TERM"]
    assert 0 < r.ttl("wrk:6:ffffffffffff-signals") <= 60


# -- spool ----------------------------------------------------------------------------

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
    assert result.json["discarded"] == [{"file": path.name, "jobs": 2, "jids": jids}]
    assert not path.exists() and r.llen("queue:spooled") == 0

"""``wurk stats``, ``queues``, ``processes``, ``workers`` and ``swarms``
against a real Redis: what each shows, as JSON and as a table.

The commands run in process (the ``cli`` fixture of tests/admin_cli.py); the
processes they list are real in-process Launchers or hand-written heartbeats.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import HOST, Cli, columns, field_lines, swarm_control
from test_api_support import job_json, launched, recording_job, ruby_heartbeat
from waiting import wait_for

import wurk
from wurk.settings.config import Config
from wurk.wire.payload import new_jid

pytestmark = pytest.mark.timeout(60)

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


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

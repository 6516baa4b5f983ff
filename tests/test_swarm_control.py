"""Remote control of a real ``wurk-swarm`` through Redis, and the admin CLI against it.

The swarm runs as a subprocess (the launcher fixture of tests/swarms.py); the
``wurk`` commands run in process (``wurk.cli.main``), except one that runs
the real ``wurk`` entry point. In-process tests of ``supervisor.remote``
cover the signal table and Redis trouble.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import admin_cli
import pytest
import redis
import swarms
from admin_cli import Cli, columns, field_lines
from conftest import RedisServer, fill_to_maxmemory, free_port
from structlog.testing import capture_logs
from swarms import REPO, Launch, SwarmProcess, event_time, gone, push, slot
from waiting import wait_beats, wait_for

from supervisor.remote import SIGNAL_COMMANDS, RemoteControl, SwarmSnapshot
from wurk.api import SwarmSet
from wurk.api import swarms as swarms_api
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(90)

# Fixtures shared with the modules they come from.
launch = swarms.launch
cli = admin_cli.cli
keep_logging = admin_cli.keep_logging

HOST = socket.gethostname()
HEARTBEAT = 0.5  # swarms.BASE_SETTINGS heartbeat_interval
# "Within one heartbeat", with room for a loaded machine: the child beats
# every 0.5 s; the deadline is several beats so the test is not flaky.
ONE_BEAT_DEADLINE = 5.0


def two_children(launch: Launch, **settings: Any) -> SwarmProcess:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]), layout={"alpha": 2},
                   **settings)
    swarm.wait_ready()
    return swarm


def registered(cli: Cli, swarm: SwarmProcess, children: int = 2) -> dict[str, Any]:
    """The swarm as ``wurk swarms --json`` shows it, once its children are listed."""
    def listed() -> dict[str, Any] | None:
        found = [s for s in cli("swarms", "--json").json if s["pid"] == swarm.pid]
        return found[0] if found and len(found[0]["children"]) == children else None
    entry: dict[str, Any] = wait_for(listed, timeout=10, what="swarm registered")
    return entry


def identities(swarm: SwarmProcess) -> dict[int, str]:
    """index -> identity of each ready alpha child."""
    return {index: info["identity"] for (_, index), info in swarm.ready().items()}


def quiet_flags(r: redis.Redis, swarm: SwarmProcess) -> dict[int, Any]:
    return {index: r.hget(identity, "quiet") for index, identity in identities(swarm).items()}


# -- registration ------------------------------------------------------------------

def test_swarm_registers_itself_and_its_children(launch: Launch, cli: Cli,
                                                 r: redis.Redis) -> None:
    swarm = two_children(launch)
    entry = registered(cli, swarm)
    children = identities(swarm)
    assert re.fullmatch(rf"{re.escape(HOST)}:{swarm.pid}:swarm-[0-9a-f]{{12}}",
                        entry["identity"])
    assert (entry["hostname"], entry["state"], entry["slots"]) == (HOST, "running",
                                                                   {"alpha": 2})
    assert entry["children"] == [children[0], children[1]]
    assert entry["topology"].endswith("topology-0.toml") and Path(entry["topology"]).exists()
    assert entry["beat"] == pytest.approx(time.time(), abs=10)
    assert 0 < r.ttl(entry["identity"]) <= 60
    assert entry["identity"] not in r.smembers("processes")  # the parent works no jobs

    processes = {p["identity"]: p for p in cli("processes", "--json").json}
    assert set(processes) == set(children.values())
    assert {(p["slot"], p["index"], p["swarm_pid"]) for p in processes.values()} == {
        ("alpha", 0, swarm.pid), ("alpha", 1, swarm.pid)}
    human = cli("swarms").lines
    assert columns(human[1])[:4] == [entry["identity"], "running", "alpha=2", "2"]

    swarm.send(signal.SIGTERM)  # a normal drain unregisters too
    assert swarm.wait_exit() == 0
    assert r.smembers("wurk:swarms") == set() and not r.exists(entry["identity"])


def test_stats_and_friends_against_a_running_swarm(launch: Launch, cli: Cli, r: redis.Redis,
                                                   redis_server: RedisServer) -> None:
    swarm = two_children(launch, shutdown_timeout=1)
    children = set(identities(swarm).values())
    for n in range(10):
        push(r, "qa", "record", f"a{n}")
    wait_for(lambda: r.llen("done") == 10, what="10 jobs done")
    # Counts reach stat:processed with each child's next heartbeat.
    wait_for(lambda: cli("stats", "--json").json["processed"] == 10, timeout=10,
             what="processed counted")
    slow = push(r, "qa", "slow_incr", "never", 30)
    wait_for(lambda: cli("workers", "--json").json, timeout=10, what="the slow job seen")

    stats = cli("stats", "--json").json
    assert (stats["processed"], stats["failed"], stats["enqueued"]) == (10, 0, 0)
    assert (stats["processes"], stats["busy"]) == (2, 1)
    [work] = cli("workers", "--json").json
    assert (work["jid"], work["class"], work["queue"]) == (slow, "slow_incr", "qa")
    assert work["process"] in children
    queues = {q["name"]: q for q in cli("queues", "--json").json}
    assert queues["qa"]["size"] == 0 and not queues["qa"]["paused"]
    busy = {p["identity"]: p["busy"] for p in cli("processes", "--json").json}
    assert sorted(busy.values()) == [0, 1] and busy[work["process"]] == 1

    # The real entry point, as an operator types it.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WURK_", "REDIS_URL"))}
    shown = subprocess.run(
        [sys.executable, "-m", "wurk.cli", "stats", "--redis-url", redis_server.url],
        capture_output=True, text=True, timeout=30, check=True,
        env={**env, "PYTHONPATH": str(REPO)})
    figures = field_lines(shown.stdout)
    assert (figures["processed"], figures["processes"], figures["busy"]) == ("10", "2", "1")


# -- one child ------------------------------------------------------------------------

def test_quiet_one_child_reaches_only_that_child(launch: Launch, cli: Cli,
                                                 r: redis.Redis) -> None:
    swarm = two_children(launch)
    children = identities(swarm)
    assert quiet_flags(r, swarm) == {0: "false", 1: "false"}

    sent = time.time()
    assert cli("quiet", children[0]).code == 0
    wait_for(lambda: r.hget(children[0], "quiet") == "true", timeout=ONE_BEAT_DEADLINE,
             interval=0.02, what="child 0 quiet")
    assert r.hget(children[1], "quiet") == "false"
    [received] = swarm.wait_events("heartbeat.signal", signal="TSTP")
    # Taken at the child's next beat: one heartbeat, plus slack for a loaded
    # machine (still under the default 5 s heartbeat).
    assert event_time(received) - sent < HEARTBEAT + 3.0

    # Child 0 may still be inside one fetch: wait until it has no thread to run a job.
    swarm.wait_processors_gone(swarm.ready()[("alpha", 0)]["pid"])
    for n in range(6):
        push(r, "qa", "record", f"q{n}")
    done = wait_for(lambda: (d := r.lrange("done", 0, -1)) and len(d) == 6 and d,
                    what="6 jobs done")
    other_pid = swarm.ready()[("alpha", 1)]["pid"]
    assert {int(entry.split(":")[1]) for entry in done} == {other_pid}


def test_a_child_stopped_remotely_exits_0_and_is_replaced(launch: Launch, cli: Cli,
                                                          r: redis.Redis) -> None:
    swarm = two_children(launch)
    before = swarm.ready()
    victim = before[("alpha", 0)]
    stopped = cli("stop", victim["identity"], "--json")
    assert stopped.json["processes"] == [victim["identity"]]

    wait_for(lambda: gone(victim["pid"]), timeout=15, what="the stopped child gone")
    exited = swarm.wait_events("child.exited", pid=victim["pid"])[0]
    assert exited["exit"] == "status 0"  # a clean drain, not a crash
    after = swarm.wait_ready(not_pids={victim["pid"]}, timeout=20)
    respawned = swarm.events("child.spawned", slot="alpha", index=0)[-1]
    # At once: no crash backoff (which would log slot.backoff); seconds of
    # room for a loaded machine.
    assert event_time(respawned) - event_time(exited) < 5.0
    assert not swarm.events("slot.backoff")
    assert after[("alpha", 0)]["pid"] != victim["pid"]  # replaced in its slot and index
    assert after[("alpha", 1)]["pid"] == before[("alpha", 1)]["pid"]
    assert swarm.proc.poll() is None
    new_identity = after[("alpha", 0)]["identity"]
    entry = wait_for(lambda: next((s for s in cli("swarms", "--json").json
                                   if new_identity in s["children"]), None),
                     timeout=10, what="the swarm lists the replacement")
    assert victim["identity"] not in entry["children"]
    assert r.hget(new_identity, "quiet") == "false"  # the replacement takes work


# -- the whole swarm --------------------------------------------------------------------

def test_quiet_swarm_quiets_every_child(launch: Launch, cli: Cli, r: redis.Redis) -> None:
    swarm = two_children(launch)
    entry = registered(cli, swarm)
    result = cli("quiet", "--swarm", entry["identity"], "--json")
    assert result.json == {"command": "quiet", "signal": "TSTP", "processes": [],
                           "swarms": [entry["identity"]], "skipped": []}

    wait_for(lambda: quiet_flags(r, swarm) == {0: "true", 1: "true"},
             timeout=2 * ONE_BEAT_DEADLINE, what="every child quiet")
    assert swarm.wait_events("swarm.remote_signal", signal="TSTP", command="quiet")
    wait_for(lambda: registered(cli, swarm)["state"] == "quiet", timeout=10,
             what="the swarm reports quiet")
    # Fetches already blocked end within fetch_timeout: wait until no child
    # has a thread left to run a job, then give them time to (wrongly) take one.
    children = swarm.ready()
    for info in children.values():
        swarm.wait_processors_gone(info["pid"])
    push(r, "qa", "record", "late")
    for info in children.values():
        wait_beats(r, info["identity"])
    assert r.llen("queue:qa") == 1 and r.llen("done") == 0
    assert not r.exists(f"{entry['identity']}-signals")  # taken, not left behind

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_stop_swarm_drains_it_and_the_parent_exits_0(launch: Launch, cli: Cli,
                                                     r: redis.Redis) -> None:
    swarm = two_children(launch, shutdown_timeout=5)
    entry = registered(cli, swarm)
    pids = {info["pid"] for info in swarm.ready().values()}
    push(r, "qa", "slow_incr", "finished", 1.5)
    wait_for(lambda: r.llen("started") == 1, what="the job started")

    assert cli("stop", "--swarm", entry["identity"]).lines == [
        f"TERM sent to swarm {entry['identity']}: stop (finish or push back running jobs, "
        "then exit) at its next beat"]
    assert swarm.wait_exit(30) == 0
    assert r.get("finished") == "1"  # the running job was let finish
    assert all(gone(pid) for pid in pids)
    assert swarm.events("swarm.remote_signal", signal="TERM", command="shutdown")
    assert r.smembers("wurk:swarms") == set()
    assert not r.exists(entry["identity"]) and not r.exists(f"{entry['identity']}-signals")
    assert r.smembers("processes") == set()
    assert cli("swarms").lines == ["no live swarms"]


def test_remote_ttin_stops_at_the_slots_max_count(launch: Launch, cli: Cli,
                                                  r: redis.Redis) -> None:
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"], max_count=3),
                   layout={"alpha": 1})
    swarm.wait_ready()
    entry = registered(cli, swarm, children=1)
    r.lpush(f"{entry['identity']}-signals", *["TTIN"] * 6)  # one taken per beat
    wait_for(lambda: not r.exists(f"{entry['identity']}-signals"), timeout=20,
             what="every TTIN taken")
    refused = swarm.wait_events("swarm.scale_refused", count=4)
    assert {(e["slot"], e["wanted"], e["max_count"]) for e in refused} == {("alpha", 3, 3)}
    assert len(swarm.events("swarm.remote_signal", signal="TTIN", command="more")) == 6
    swarm.wait_ready({"alpha": 3})
    assert registered(cli, swarm, children=3)["slots"] == {"alpha": 3}
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_restart_swarm_replaces_every_child(launch: Launch, cli: Cli) -> None:
    swarm = two_children(launch)
    entry = registered(cli, swarm)
    old = {info["pid"] for info in swarm.ready().values()}
    assert cli("restart", "--swarm", entry["identity"]).code == 0
    after = swarm.wait_ready(not_pids=old, timeout=30)
    assert not old & {info["pid"] for info in after.values()}
    assert swarm.events("swarm.rolling_restart")
    assert swarm.proc.poll() is None


def test_a_killed_parent_shows_stale_and_refuses_control(launch: Launch, cli: Cli,
                                                         r: redis.Redis) -> None:
    swarm = two_children(launch)
    entry = registered(cli, swarm)
    swarm.send(signal.SIGKILL)  # no drain, no unregister: its hash lives on for its TTL
    assert swarm.wait_exit() == -signal.SIGKILL

    def shown_stale() -> bool:
        listed = [s for s in cli("swarms", "--json").json if s["identity"] == entry["identity"]]
        return bool(listed) and listed[0]["state"] == "stale"
    # Two missed beats of 0.5 s; the hash itself would live 60 s.
    wait_for(shown_stale, timeout=ONE_BEAT_DEADLINE * 2, what="the killed swarm shown stale")
    assert r.ttl(entry["identity"]) > 10

    refused = cli("restart", "--swarm", entry["identity"])
    assert refused.code == 1
    assert "is stale" in refused.err and "nothing was sent" in refused.err
    assert not r.exists(f"{entry['identity']}-signals")
    everyone = cli("stop", "--all", "--json")
    assert everyone.code == 0
    assert entry["identity"] in [s["identity"] for s in everyone.json["skipped"]]
    assert everyone.json["swarms"] == []


def test_stale_is_two_missed_beats_of_the_swarms_own_interval(config: Config) -> None:
    now = time.time()
    def swarm(beat_age: float, interval: Any) -> Any:
        info = json.dumps({"beat_interval": interval}) if interval is not None else "{}"
        found = swarms_api.SwarmProcess.from_fields(
            "h:1:swarm-x", [info, repr(now - beat_age), "quiet", "[]"], config=config)
        assert found is not None
        return found
    assert not swarm(9, 5).stale(now) and swarm(11, 5).stale(now)
    assert swarm(11, 5).state == "stale" and swarm(1, 5).state == "quiet"
    assert not swarm(50, 30).stale(now)
    # An older swarm writes no interval, or a hostile one: the default 5 s.
    for hostile in (None, "5", True, -1, 1e9):
        assert swarm(11, hostile).stale(now) and not swarm(9, hostile).stale(now)


def test_redis_down_for_the_parent_never_stalls_supervision(launch: Launch,
                                                            redis_server: RedisServer) -> None:
    """The [wurk] Redis (the parent's) refuses connections; the slot's works.

    The parent fails to beat on every refresh, yet still respawns a killed
    child promptly and drains on TERM.
    """
    dead = f"redis://127.0.0.1:{free_port()}/0"
    # Long Redis backoff for the parent: supervision that waited on it would
    # stall for a minute, far past the bound below.
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"],
                        redis_url=redis_server.url),
                   layout={"alpha": 2}, redis_url=dead, redis_retry_attempts=10,
                   redis_retry_base=5.0, redis_retry_cap=10.0)
    before = swarm.wait_ready()
    failures = swarm.wait_events("swarm.remote_failed", count=2)
    assert "ConnectError" in failures[0]["error"]
    victim = before[("alpha", 1)]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    swarm.wait_ready(not_pids={victim}, timeout=20)
    # A respawn and a child boot (a second or two), with room for a loaded machine.
    assert time.monotonic() - killed_at < 15
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(20) == 0


# -- supervisor.remote in process -------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(**slots: int) -> SwarmSnapshot:
    return SwarmSnapshot(slots=slots or {"alpha": 1}, children=[], state="running")


def test_every_remote_signal_becomes_its_command(config: Config, r: redis.Redis) -> None:
    clock = Clock()
    commands: list[str] = []
    control = RemoteControl(config, Path("t.toml"), commands.append, clock=clock)
    signals = f"{control.identity}-signals"
    for name in SIGNAL_COMMANDS:
        r.lpush(signals, name)
        control.refresh(snapshot())
        clock.now += config.heartbeat_interval
    assert commands == list(SIGNAL_COMMANDS.values())
    assert SIGNAL_COMMANDS == {"TSTP": "quiet", "TERM": "shutdown", "TTIN": "more",
                               "TTOU": "fewer", "USR1": "restart", "HUP": "restart",
                               "USR2": "status"}

    r.lpush(signals, "TSTP", "BOGUS")  # LPUSH then RPOP: first in, first out
    control.refresh(snapshot())
    control.refresh(snapshot())  # not due yet: nothing read
    assert commands[-1] == "quiet" and r.llen(signals) == 1
    clock.now += config.heartbeat_interval
    with capture_logs() as logs:
        control.refresh(snapshot())
    assert commands[-1] == "quiet" and len(commands) == len(SIGNAL_COMMANDS) + 1
    assert [e["signal"] for e in logs if e["event"] == "swarm.unknown_signal"] == ["BOGUS"]


def test_refresh_rewrites_the_hash_and_unregister_removes_everything(
        config: Config, r: redis.Redis) -> None:
    clock = Clock()
    control = RemoteControl(config, Path("t.toml"), lambda name: None, clock=clock)
    control.refresh(SwarmSnapshot({"alpha": 2}, ["c1", "c2"], "running"))
    clock.now += config.heartbeat_interval
    control.refresh(SwarmSnapshot({"alpha": 3}, ["c1"], "quiet"))
    fields = r.hgetall(control.identity)
    assert json.loads(fields["info"])["slots"] == {"alpha": 3}
    assert (json.loads(fields["children"]), fields["state"]) == (["c1"], "quiet")
    r.lpush(f"{control.identity}-signals", "TERM")
    control.unregister()
    assert r.smembers("wurk:swarms") == set()
    assert not r.exists(control.identity) and not r.exists(f"{control.identity}-signals")


def test_redis_trouble_is_logged_and_never_raised(redis_server: RedisServer) -> None:
    # A 5 s backoff: a second try of either call would show in the time.
    config = Config(redis_url=f"redis://127.0.0.1:{free_port()}/0", heartbeat_interval=0.2,
                    redis_retry_base=5.0, redis_retry_cap=10.0)
    control = RemoteControl(config, Path("t.toml"), lambda name: None)
    started = time.monotonic()
    with capture_logs() as logs:
        control.refresh(snapshot())
        control.unregister()
    assert time.monotonic() - started < 5  # one refused dial each, no backoff
    events = [e["event"] for e in logs]
    assert "swarm.remote_failed" in events and "swarm.unregister_failed" in events
    close_runtime(config)


def test_at_maxmemory_the_swarm_still_registers_and_takes_its_signals(
        own_redis: RedisServer) -> None:
    client = own_redis.client()
    config = Config(redis_url=own_redis.url, heartbeat_interval=0.2)
    commands: list[str] = []
    control = RemoteControl(config, Path("t.toml"), commands.append)
    try:
        client.lpush(f"{control.identity}-signals", "TSTP")
        fill_to_maxmemory(client)
        with capture_logs() as logs:
            control.refresh(snapshot())  # before: a MULTI refused whole (OOM)
        assert not [e for e in logs if e["event"] == "swarm.remote_failed"]
        assert commands == ["quiet"]
        assert control.identity in client.smembers("wurk:swarms")
        assert client.hget(control.identity, "state") == "running"
        control.unregister()  # SREM and UNLINK: allowed at maxmemory
        assert client.smembers("wurk:swarms") == set()
    finally:
        close_runtime(config)
        client.close()


def test_ttin_and_ttou_may_name_one_slot(config: Config, r: redis.Redis) -> None:
    clock = Clock()
    commands: list[str] = []
    control = RemoteControl(config, Path("t.toml"), commands.append, clock=clock)
    signals = f"{control.identity}-signals"
    for name in ("TTIN:alpha", "TTOU:beta", "TSTP:alpha", "TTIN:", "TTIN:a:b"):
        r.lpush(signals, name)
        with capture_logs() as logs:
            control.refresh(snapshot())
        clock.now += config.heartbeat_interval
        if name in ("TSTP:alpha", "TTIN:"):
            assert [e["event"] for e in logs] == ["swarm.unknown_signal"]
    assert commands == ["more:alpha", "fewer:beta", "more:a:b"]


def test_the_hash_reports_restarts_per_slot_and_index(config: Config, r: redis.Redis) -> None:
    control = RemoteControl(config, Path("t.toml"), lambda name: None, clock=Clock())
    control.refresh(SwarmSnapshot({"alpha": 2}, [], "running", {"alpha": {"1": 3}}))
    [swarm] = list(SwarmSet(config=config))
    assert swarm.restarts == {("alpha", 1): 3}
    info = json.loads(r.hget(control.identity, "info"))
    info["restarts"] = {"alpha": {"x": 1, "2": "many", "3": 4}, "beta": [1]}
    r.hset(control.identity, "info", json.dumps(info))
    [swarm] = list(SwarmSet(config=config))
    assert swarm.restarts == {("alpha", 3): 4}

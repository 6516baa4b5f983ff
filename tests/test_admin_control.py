"""``wurk pause``/``unpause`` and the remote control commands (``quiet``,
``stop``, ``restart``, ``dump``): unknown names send nothing, embedded
processes are refused, ``--all`` reaches swarms and leaves their children to
them, signals sent by name expire, and a real ``wurk run`` process obeys.

The commands run in process (the ``cli`` fixture of tests/admin_cli.py); the
processes they steer are real (an in-process Launcher, a ``wurk run``
subprocess). Swarm-level control is in test_swarm_control.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import admin_cli
import cli_workers
import pytest
import redis
from admin_cli import HOST, Cli, swarm_control
from conftest import RedisServer
from test_api_support import launched, recording_job, ruby_heartbeat
from tuning import tuned
from waiting import wait_beats, wait_for

from wurk.settings.config import Config

pytestmark = pytest.mark.timeout(60)

keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


def test_unpause_names_unknown_queues_and_changes_nothing(cli: Cli, r: redis.Redis) -> None:
    r.sadd("queues", "default")
    r.sadd("paused", "default")
    result = cli("unpause", "default", "nope")
    assert result.code == 1
    assert result.err == "wurk: unknown queue 'nope' (not in the 'queues' set)\n"
    assert r.smembers("paused") == {"default"}  # checked all first: default stayed paused


def test_a_queue_can_be_paused_before_anything_was_pushed_to_it(cli: Cli, r: redis.Redis) -> None:
    # Pausing ahead of a deploy: the queue exists only once its first job is pushed.
    result = cli("pause", "reports", "--json")
    assert result.code == 0
    assert result.json == {"action": "pause", "queues": ["reports"], "unseen": ["reports"]}
    assert r.smembers("paused") == {"reports"}
    assert "nothing was pushed to it yet" in cli("pause", "reports").lines[0]
    # Paused but never pushed to: unpause knows it.
    assert cli("unpause", "reports").lines == ["unpaused 'reports'"]
    assert r.smembers("paused") == set()
    assert cli("pause", " ").code != 0


def test_a_paused_queue_runs_its_job_only_after_unpause(cli: Cli, config: Config,
                                                        r: redis.Redis) -> None:
    r.sadd("queues", "default")
    paused = cli("pause", "default", "--json")
    assert paused.json == {"action": "pause", "queues": ["default"], "unseen": []}
    assert r.smembers("paused") == {"default"}
    # in this order: "default" first, unless paused
    config = tuned(config, queues=["default", "probe"])
    with recording_job() as (job, runs), launched(config):
        job.perform_async("held")
        # A fetch that took the later job passed "held" over: it had the chance.
        job.set(queue="probe").perform_async("probe")
        wait_for(lambda: runs, timeout=15, what="a job run")
        assert runs == [("probe",)]
        assert r.llen("queue:default") == 1
        assert {q["name"]: q["paused"] for q in cli("queues", "--json").json} == {
            "default": True, "probe": False}

        assert cli("unpause", "default").lines == ["unpaused 'default'"]
        wait_for(lambda: runs == [("probe",), ("held",)], timeout=10)
    assert r.smembers("paused") == set()


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


def test_signals_sent_by_name_expire(cli: Cli, r: redis.Redis) -> None:
    ruby_heartbeat(r, "wrk:6:ffffffffffff", {"hostname": "wrk", "pid": 6})
    assert cli("stop", "wrk:6:ffffffffffff").code == 0
    assert r.lrange("wrk:6:ffffffffffff-signals", 0, -1) == ["TERM"]
    assert 0 < r.ttl("wrk:6:ffffffffffff-signals") <= 60


@pytest.fixture
def wurk_run(redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> Iterator[
        Callable[..., cli_workers.Worker]]:
    (tmp_path / "clijobs.py").write_text(cli_workers.JOBS_MODULE)
    workers: list[cli_workers.Worker] = []

    def start(*args: str) -> cli_workers.Worker:
        worker = cli_workers.Worker(list(args), cli_workers.child_env(redis_server.url, tmp_path),
                                 tmp_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def test_dump_quiet_and_stop_reach_a_wurk_run_process(
        cli: Cli, r: redis.Redis, wurk_run: Callable[..., cli_workers.Worker]) -> None:
    worker = wurk_run("-r", "clijobs", "--log-level", "info", "-c", "2")
    identity = cli_workers.registered_identity(r, worker)

    dumped = cli("dump", identity, "--json")
    assert dumped.json == {"command": "dump", "signal": "TTIN", "processes": [identity],
                           "swarms": [], "skipped": []}
    wait_for(lambda: any(e.get("event") == "thread.dump" for e in worker.events()),
             timeout=10)

    quieted = cli("quiet", identity)
    assert quieted.lines == [f"TSTP sent to process {identity}: quiet (take no new jobs) "
                             "at its next heartbeat"]
    # Quiet, and no processor thread left that could run a job.
    cli_workers.wait_quiet(r, worker, identity)
    cli_workers.push(r, "cli_echo", "late")
    wait_beats(r, identity)  # still running, with time for a fetch it must not make
    assert r.llen("cli:done") == 0 and r.llen("queue:default") == 1

    assert cli("stop", identity).code == 0
    assert worker.wait(15) == 0, worker.stderr()
    assert r.smembers("processes") == set()
    assert r.llen("queue:default") == 1  # a quiet process never took it
    assert any(e.get("event") == "heartbeat.signal" and e.get("signal") == "TERM"
               for e in worker.events())

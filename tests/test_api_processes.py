"""wurk.api processes: liveness, pruning, fields and remote control (spec §9, §10, §11, §14)."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis
from structlog.testing import capture_logs
from test_api_support import RUBY_IDENTITY, RUBY_INFO, launched, ruby_heartbeat
from tuning import tuned
from waiting import wait_for

from wurk.api import Process, ProcessControlError, ProcessSet, UnknownProcessError
from wurk.settings.config import Config
from wurk.version import __version__

GHOST = "ghost:1:deadbeef0000"
MODERN = "web-1:4242:0123456789ab"


def modern_info(**extra: object) -> dict[str, object]:
    """Sidekiq 8.1.2+: no concurrency in info; it lives in the hash field."""
    return {"hostname": "web-1", "started_at": 1796022187.5, "pid": 4242, "tag": "api",
            "queues": ["critical", "default"], "labels": ["blue"], "identity": MODERN,
            "version": "8.1.7", "embedded": False, **extra}


def test_reads_a_ruby_6_4_heartbeat(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, busy=1)
    [process] = ProcessSet(config=config)
    assert isinstance(process, Process)
    assert (process.identity, process.hostname, process.pid) == (RUBY_IDENTITY, "vm", 6757)
    assert (process.tag, process.labels, process.queues) == ("mytag", [], ["default", "other"])
    assert (process.concurrency, process.busy, process.rss, process.rtt_us) == (3, 1, 31180, 47)
    assert process.beat == pytest.approx(time.time(), abs=2)
    assert process.started_at == 1796022187.704982
    assert process.is_quiet is False and process.stopping is False
    assert (process.version, process.embedded, process.slot, process.index) == (None, False,
                                                                                 None, None)
    assert process["quiet"] == "false" and process["pid"] == 6757


def test_concurrency_hash_field_wins_and_totals_sum_live_processes(config: Config,
                                                                   r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO, rss=1000)
    ruby_heartbeat(r, MODERN, modern_info(), rss=500, quiet="true",
                   extra={"concurrency": 10})
    r.sadd("processes", GHOST)
    processes = ProcessSet(config=config)
    modern = processes.lookup(MODERN)
    assert (modern.concurrency, modern.version, modern.labels) == (10, "8.1.7", ["blue"])
    assert modern.is_quiet and modern.stopping
    assert [p.identity for p in processes] == [RUBY_IDENTITY, MODERN]  # sorted, ghost skipped
    assert (processes.total_concurrency, processes.total_rss_in_kb) == (13, 1500)
    assert processes.size == len(processes) == 3  # SCARD: unpruned


def test_swarm_children_expose_slot_and_index(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, MODERN, modern_info(slot="web", index=2, swarm_pid=99))
    process = ProcessSet(config=config).lookup(MODERN)
    assert (process.slot, process.index) == ("web", 2)


def test_get_and_lookup_need_membership_and_an_unexpired_heartbeat(config: Config,
                                                                   r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO)
    r.sadd("processes", GHOST)
    r.hset("stopped:1:000000000000", "info", json.dumps(RUBY_INFO))  # left after SREM
    processes = ProcessSet(config=config)
    found = processes.get(RUBY_IDENTITY)
    assert found is not None and found.identity == RUBY_IDENTITY
    for identity in (GHOST, "stopped:1:000000000000", "never:1:000000000000"):
        assert processes.get(identity) is None
        with pytest.raises(UnknownProcessError, match=identity) as err:
            processes.lookup(identity)
        assert isinstance(err.value, LookupError)


def test_cleanup_prunes_a_process_whose_heartbeat_expired(config: Config,
                                                          r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO)
    ruby_heartbeat(r, MODERN, modern_info(), ttl_ms=50)  # crashes: no further beats
    processes = ProcessSet(config=config)
    assert [p.identity for p in processes] == [RUBY_IDENTITY, MODERN]
    wait_for(lambda: not r.exists(MODERN))
    assert [p.identity for p in processes] == [RUBY_IDENTITY]  # skipped before any prune
    assert processes.size == 2
    assert processes.cleanup() == 1
    assert r.smembers("processes") == {RUBY_IDENTITY}
    assert processes.size == 1


def test_cleanup_runs_once_a_minute_across_callers(config: Config, r: redis.Redis) -> None:
    r.sadd("processes", GHOST)
    assert ProcessSet(config=config).cleanup() == 1
    assert 0 < r.ttl("process_cleanup") <= 60
    r.sadd("processes", "ghost:2:deadbeef0001")
    assert ProcessSet(config=config).cleanup() == 0  # lock held: nothing pruned
    assert r.scard("processes") == 1
    r.delete("process_cleanup")  # the minute has passed
    assert ProcessSet(config=config).cleanup() == 1
    assert r.scard("processes") == 0


def test_cleanup_with_nothing_dead_still_takes_the_lock(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO)
    assert ProcessSet(config=config).cleanup() == 0
    assert r.exists("process_cleanup")
    assert r.smembers("processes") == {RUBY_IDENTITY}


def test_leader_reads_dear_leader(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO)
    processes = ProcessSet(config=config)
    assert processes.leader == ""
    assert not processes.lookup(RUBY_IDENTITY).is_leader
    r.set("dear-leader", RUBY_IDENTITY)
    assert processes.leader == RUBY_IDENTITY
    assert processes.lookup(RUBY_IDENTITY).is_leader


def test_signals_are_queued_as_sidekiq_queues_them(config: Config, r: redis.Redis) -> None:
    ruby_heartbeat(r, RUBY_IDENTITY, RUBY_INFO)
    process = ProcessSet(config=config).lookup(RUBY_IDENTITY)
    process.quiet()
    process.dump_threads()
    process.stop()
    key = f"{RUBY_IDENTITY}-signals"
    assert r.lrange(key, 0, -1) == ["TERM", "TTIN", "TSTP"]  # RPOP takes TSTP first
    assert 55 < r.ttl(key) <= 60


def test_embedded_processes_refuse_quiet_and_stop(config: Config, r: redis.Redis) -> None:
    with launched(config, extra_info={"embedded": True}) as launcher:
        process = ProcessSet(config=config).lookup(launcher.identity)
        assert process.embedded
        for command in (process.quiet, process.stop):
            with pytest.raises(ProcessControlError, match="embedded"):
                command()
        assert not r.exists(f"{launcher.identity}-signals")
        with capture_logs() as logs:
            process.dump_threads()  # harmless, so allowed
            wait_for(lambda: any(e["event"] == "thread.dump" for e in logs))
        assert not launcher.manager.quieting


def test_a_real_launcher_as_the_api_sees_it(config: Config) -> None:
    config = tuned(config, tag="t1", labels=["x"], queues=["critical", "default"])
    with launched(config) as launcher:
        process = ProcessSet(config=config).lookup(launcher.identity)
        assert (process.pid, process.tag, process.labels) == (os.getpid(), "t1", ["x"])
        assert (process.queues, process.concurrency) == (["critical", "default"], 10)
        assert (process.version, process.embedded, process.is_quiet) == (__version__, False,
                                                                          False)
        assert process.rss > 0
        assert ProcessSet(config=config).total_concurrency == 10


def test_remote_quiet_reaches_a_real_launcher(config: Config, r: redis.Redis) -> None:
    with launched(config) as launcher:
        ProcessSet(config=config).lookup(launcher.identity).quiet()
        wait_for(lambda: r.hget(launcher.identity, "quiet") == "true")
        assert launcher.manager.quieting
        assert ProcessSet(config=config).lookup(launcher.identity).stopping
        assert not launcher.stopped.is_set()


def test_remote_stop_reaches_a_real_launcher(config: Config, r: redis.Redis) -> None:
    with launched(config) as launcher:
        ProcessSet(config=config).lookup(launcher.identity).stop()
        wait_for(launcher.stopped.is_set)
        assert not r.sismember("processes", launcher.identity)
        assert ProcessSet(config=config).get(launcher.identity) is None


def test_remote_dump_threads_reaches_a_real_launcher(config: Config, r: redis.Redis) -> None:
    with launched(config) as launcher, capture_logs() as logs:
        ProcessSet(config=config).lookup(launcher.identity).dump_threads()
        # One event per thread, logged one after another: wait for a late one.
        wait_for(lambda: {"wurk-heartbeat", "MainThread"} <= {
            e.get("thread") for e in logs if e["event"] == "thread.dump"})
        assert not launcher.manager.quieting

"""Redis Sentinel end to end: a real failover under load loses no job.

On loopback: one primary, one replica and three sentinels (``redis-server --sentinel``,
so the suite needs no package beyond redis-server).
Both servers run with ``min-replicas-to-write 1`` (the documented wurk
recommendation), so a primary that has lost its replica -- the demoted one
before Sentinel reconfigures it, and the promoted one before its new replica
has synced -- answers writes with NOREPLICAS instead of accepting writes it
would later throw away. wurk treats NOREPLICAS as "refused, nothing applied":
the pool reconnects through Sentinel, the push buffer keeps refused pushes,
the fetcher and the jobs try again.

A client (reliable push, confirmed by a replica: with Sentinel configured,
``push_replicas`` defaults to 1) and
an in-process Launcher (reliable fetch) push and work jobs while ``SENTINEL
FAILOVER`` runs; afterwards every pushed jid is in ``done`` and both talk to
the new primary.

``min-replicas-to-write`` cannot close one window: replication is
asynchronous, so the old primary can take a write in the instant before the
replica is promoted and then throw it away when it resyncs as a replica.
Confirmed pushes close it for pushes (a push counts only once the replica
acknowledged it, and is sent again otherwise), and the fetcher's resync
after a disruption closes it for acknowledgements. Without them this test
lost a job in about one run in ten.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import waiting
from conftest import RedisServer, free_port, reap_probe_clients, redis_server_binary, start_redis
from pushing import Pusher

import wurk
from wurk.redis.pool import RedisPool
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.redis.sentinel import SentinelSettings
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config, ConfigError

MASTER = "mymaster"
JOB = "sentinel_record"

# The worker's config, for the job (it runs in this process's Launcher).
_worker: dict[str, Config] = {}


@wurk.job(name=JOB)
def sentinel_record(jid: str) -> None:
    """Append the jid to ``done`` on the current primary, through the worker's pool.

    While the failover runs every write is refused (NOREPLICAS, READONLY):
    nothing applied, so trying again is safe; only an unknown outcome (a
    broken connection after sending) can make a duplicate here.
    """
    pool = runtime_for(_worker["config"]).pool
    deadline = time.monotonic() + 40
    while True:
        try:
            pool.call("RPUSH", "done", jid)
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll every 0.1 s; Redis errors mid-failover count as "not yet"."""
    return waiting.wait_for(predicate, timeout, 0.1, what, ignoring=(redis.RedisError,))


def client_for(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True,
                       socket_timeout=5, socket_connect_timeout=2)


def info_replication(port: int) -> dict[str, Any]:
    with client_for(port) as c:
        return dict(c.info("replication"))


@dataclass
class SentinelCluster:
    primary: RedisServer
    replica: RedisServer
    sentinel_ports: list[int]
    sentinel_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def master_ports(self) -> set[int]:
        """What each sentinel says the master is (one entry when they agree)."""
        ports = set()
        for port in self.sentinel_ports:
            with client_for(port) as c:
                _, master_port = c.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
                ports.add(int(master_port))
        return ports

    def stop(self) -> None:
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        for server in (self.primary, self.replica):
            if server.proc.poll() is None:
                server.proc.kill()
            server.proc.wait(10)
            shutil.rmtree(server.workdir, ignore_errors=True)


SAFE_WRITES = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    primary = start_redis(*SAFE_WRITES)
    replica = start_redis(*SAFE_WRITES, "--replicaof", "127.0.0.1", str(primary.port))
    reap_probe_clients()
    found = SentinelCluster(primary, replica, [free_port() for _ in range(3)])
    try:
        for port in found.sentinel_ports:
            conf = tmp_path / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 5000\n", encoding="utf-8")
            with (tmp_path / f"sentinel-{port}.log").open("wb") as log:
                found.sentinel_procs.append(subprocess.Popen(
                    [redis_server_binary(), str(conf), "--sentinel"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=tmp_path))
        wait_for(lambda: info_replication(primary.port).get("connected_slaves") == 1
                 and info_replication(replica.port).get("master_link_status") == "up",
                 10, "replica in sync")

        def replica_acknowledges() -> bool:
            # Connected is not yet "good": min-replicas-to-write counts only a
            # replica that is online and acknowledging, so probe with a write.
            with client_for(primary.port) as c:
                c.set("wurk-test:probe", 1)
                return bool(c.execute_command("WAIT", 1, 500) == 1)

        wait_for(replica_acknowledges, 10, "replica acknowledges writes")

        def sentinels_ready() -> bool:
            for port in found.sentinel_ports:
                with client_for(port) as c:
                    replicas = c.sentinel_slaves(MASTER)
                    peers = c.sentinel_sentinels(MASTER)
                healthy = [r for r in replicas
                           if r["is_slave"] and not (r["is_sdown"] or r["is_disconnected"])]
                if len(healthy) != 1 or len(peers) != 2:
                    return False
            return True

        wait_for(sentinels_ready, 15, "sentinels know the replica and each other")
        yield found
    finally:
        found.stop()


class ErrorLog:
    """An ``on_redis_error`` hook that counts actions (retry, unsafe, ...)."""

    def __init__(self) -> None:
        self.actions: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, error: BaseException, *, attempt: int, action: str) -> None:
        with self._lock:
            self.actions[action] = self.actions.get(action, 0) + 1


def sentinel_config(cluster: SentinelCluster, hook: ErrorLog, **extra: Any) -> Config:
    # The URL's host and port are never dialled: Sentinel names the primary.
    return Config(redis_url="redis://127.0.0.1:1/0", sentinels=cluster.addresses,
                  sentinel_master=MASTER, redis_retry_base=0.05, redis_retry_cap=0.5,
                  log_level="warning", on_redis_error=hook, **extra)


# The guard covers the fixture's waits (35 s) and the test's own (110 s): a
# failover's steps are timed by Sentinel (its 10 s INFO period, a retried
# election), so a slow run is slow here without being wrong.
@pytest.mark.timeout(180)
def test_failover_under_load_loses_no_job(cluster: SentinelCluster) -> None:
    started = time.monotonic()
    old, new = cluster.primary, cluster.replica
    hook = ErrorLog()
    worker_config = sentinel_config(cluster, hook, concurrency=5, heartbeat_interval=0.5,
                                    fetch_timeout=0.5, poll_interval_average=0.5,
                                    shutdown_timeout=2.0)
    # push_replicas unset: with Sentinel, pushes are confirmed on one replica.
    client_config = sentinel_config(cluster, hook)
    _worker["config"] = worker_config
    launcher = Launcher(worker_config)
    client = wurk.Client(client_config)
    assert client.buffer is not None  # reliable push is on by default
    assert client.confirmed is not None and client.confirmed.replicas == 1
    pusher = Pusher(client, JOB)
    try:
        launcher.start()
        pusher.start()
        with client_for(old.port) as c:
            wait_for(lambda: c.llen("done") >= 50, 10, "jobs flow before the failover")

        # The failover, asked of the second sentinel (the clients ask the first).
        with client_for(cluster.sentinel_ports[1]) as c:
            wait_for(lambda: c.execute_command("SENTINEL", "FAILOVER", MASTER), 10,
                     "SENTINEL FAILOVER accepted")
        failover_at = time.monotonic()
        wait_for(lambda: cluster.master_ports() == {new.port}, 15, "every sentinel names it")
        switched = time.monotonic() - failover_at
        # The old primary is reconfigured as a replica once Sentinel's next
        # INFO sees it still claiming to be a master (about 8-10 s later).
        wait_for(lambda: (info := info_replication(old.port))["role"] == "slave"
                 and info["master_port"] == new.port and info["master_link_status"] == "up",
                 25, "old primary demoted and in sync")
        demoted = time.monotonic() - failover_at
        with client_for(new.port) as c:
            # Jobs flow again once the new primary accepts writes.
            base = c.llen("done")
            wait_for(lambda: c.llen("done") > base + 20, 15, "jobs flow after the failover")
        pusher.stop()

        assert client.buffer.flush(15), f"{len(client.buffer)} pushes still buffered"
        expected = set(pusher.accepted)

        def drained() -> bool:
            with client_for(new.port) as c:
                return expected <= set(c.lrange("done", 0, -1))

        with contextlib.suppress(AssertionError):
            wait_for(drained, 20, "every accepted jid done")
        with client_for(new.port) as c:
            done = c.lrange("done", 0, -1)
            leftovers = c.llen("queue:default")
        lost = expected - set(done)
        duplicates = len(done) - len(set(done))
        print(f"\nsentinel failover: pushed={len(expected)} uncertain={len(pusher.uncertain)} "
              f"executed={len(set(done))} lost={len(lost)} duplicates={duplicates} "
              f"switch={switched:.1f}s demoted={demoted:.1f}s "
              f"errors={hook.actions} total={time.monotonic() - started:.1f}s")
        assert not lost, f"LOST {len(lost)} jobs (queue:default holds {leftovers}): " \
                         f"{sorted(lost)[:10]}"
        assert not pusher.uncertain, pusher.uncertain[:5]
        # Nothing went to the retry or dead sets: every refusal was retried in place.
        with client_for(new.port) as c:
            assert c.zcard("retry") == 0 and c.zcard("dead") == 0

        # Both pools now reach the new primary.
        for config in (worker_config, client_config):
            reply = runtime_for(config).pool.call("CONFIG", "GET", "port", idempotent=True)
            # A map under RESP3, a flat [name, value] list under RESP2.
            port = reply[b"port"] if isinstance(reply, dict) else reply[1]
            assert int(port) == new.port
    finally:
        pusher.stop()
        launcher.stop(time.monotonic() + 3)
        close_runtime(client_config)
        close_runtime(worker_config)
        _worker.clear()


def test_sentinels_without_a_master_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="sentinel_master"):
        Config(sentinels=["h:1"])
    with pytest.raises(ConfigError, match="sentinel_master"):
        Config(sentinel_master="m")
    with pytest.raises(ConfigError, match="host:port"):
        Config(sentinels=["nohost"], sentinel_master="m")


def test_sentinels_from_the_environment() -> None:
    config = Config.load(env={"WURK_SENTINELS": "a:1,b:2", "WURK_SENTINEL_MASTER": "m"})
    assert config.sentinels == ["a:1", "b:2"]
    assert config.sentinel_master == "m"
    settings = SentinelSettings.from_config(config)
    assert settings is not None
    assert settings.sentinels == (("a", 1), ("b", 2))
    assert settings.master == "m"
    assert SentinelSettings.from_config(Config()) is None


@pytest.fixture
def lonely_primary() -> Iterator[RedisServer]:
    """A primary that wants one replica and has none: every write gets NOREPLICAS."""
    server = start_redis(*SAFE_WRITES)
    reap_probe_clients()
    yield server
    server.stop()
    shutil.rmtree(server.workdir, ignore_errors=True)


class Actions:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, error: BaseException, *, attempt: int, action: str) -> None:
        self.seen.append((action, attempt))


@pytest.mark.parametrize("transaction", [False, True])
def test_a_pipeline_refused_with_noreplicas_gets_one_reconnect_and_retry(
        lonely_primary: RedisServer, transaction: bool) -> None:
    """A refused batch applied nothing: the failover rule applies, not "unsafe"."""
    actions = Actions()
    pool = RedisPool(lonely_primary.url, on_error=actions, sleep=lambda _: None)
    try:
        with pytest.raises(redis.ResponseError, match=r"^NOREPLICAS"):
            pool.pipeline([("SADD", "queues", "q"), ("LPUSH", "queue:q", "job")],
                          transaction=transaction)
        assert actions.seen == [("retry", 1), ("exhausted", 2)]
        # A batch in which something was answered normally may have applied: no replay.
        actions.seen.clear()
        with pytest.raises(redis.ResponseError, match=r"^NOREPLICAS"):
            pool.pipeline([("GET", "k"), ("LPUSH", "queue:q", "job")])
        assert actions.seen == [("unsafe", 1)]
    finally:
        pool.close()

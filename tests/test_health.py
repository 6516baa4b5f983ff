"""The health listener: real HTTP requests against /live, /ready and friends."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, free_port, start_redis
from waiting import wait_for

from supervisor.topology import TopologyError, load
from wurk.runtime.health import HealthChecks, HealthServer
from wurk.runtime.launcher import Launcher
from wurk.settings.addresses import listen_address, parse_listen
from wurk.settings.config import Config, ConfigError


def get(port: int, path: str) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            status, body = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, json.loads(body)


def test_live_and_ready_then_quiet_fails_ready(config: Config, r: redis.Redis,
                                               launch_with: Callable[..., Launcher]) -> None:
    launcher = launch_with(dataclasses.replace(config, health_listen="127.0.0.1:0"))
    assert launcher.health is not None
    port = launcher.health.port
    assert port > 0
    info = json.loads(r.hget(launcher.identity, "info") or "{}")
    assert info["health_port"] == port

    status, body = get(port, "/live")
    assert status == 200 and body["status"] == "live" and body["identity"] == launcher.identity
    assert get(port, "/ready") == (200, {"status": "ready", "identity": launcher.identity})

    launcher.quiet()
    status, body = get(port, "/ready")
    assert status == 503 and body["status"] == "quiet"
    assert get(port, "/live")[0] == 200  # quiet is not dead

    status, body = get(port, "/nope")
    assert status == 404 and body["paths"] == ["/live", "/ready"]
    assert get(port, "/metrics")[0] == 404  # metrics_prometheus is off

    launcher.stop(time.monotonic() + 2)
    with pytest.raises(urllib.error.URLError):
        get(port, "/live")


def test_redis_down_fails_ready_then_live_and_both_recover(
        config: Config, launch_with: Callable[..., Launcher]) -> None:
    server = start_redis()
    try:
        own = dataclasses.replace(config, redis_url=server.url, health_listen="127.0.0.1:0",
                                  concurrency=1, redis_retry_attempts=1,
                                  redis_connect_timeout=0.3, redis_read_timeout=0.5)
        launcher = launch_with(own)
        assert launcher.health is not None
        port = launcher.health.port
        assert get(port, "/ready")[0] == 200

        server.stop()
        status, body = get(port, "/ready")
        assert status == 503 and body["status"] == "redis_unavailable"
        assert "onnect" in body["error"]
        # No beat reaches Redis: after three intervals the process is not live.
        status, body = wait_for(lambda: (reply := get(port, "/live"))[0] == 503 and reply)
        assert body["status"] == "stale" and body["beat_age"] > 3 * own.heartbeat_interval

        server = start_redis(port=server.port)
        wait_for(lambda: get(port, "/ready")[0] == 200)
        wait_for(lambda: get(port, "/live")[0] == 200)
        launcher.stop(time.monotonic() + 2)
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


def test_swarm_child_index_offsets_a_fixed_port(config: Config,
                                                launch_with: Callable[..., Launcher]) -> None:
    base = free_port()
    while not _bindable(base + 2):
        base = free_port()
    launcher = launch_with(dataclasses.replace(config, health_listen=f"127.0.0.1:{base}"),
                      extra_info={"slot": "a", "index": 2})
    assert launcher.health is not None and launcher.health.port == base + 2
    assert get(base + 2, "/live")[0] == 200


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_busy_port_is_retried_until_it_frees(config: Config) -> None:
    blocker = socket.socket()  # bound, not listening: connections are refused at once
    blocker.bind(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    checks = HealthChecks(config, last_beat=time.monotonic, quiet=lambda: False)
    server = HealthServer(("127.0.0.1", port), checks)
    try:
        assert server.start() == port  # the old child still holds it: no crash
        with pytest.raises(urllib.error.URLError):
            get(port, "/live")  # nobody serves it yet
        blocker.close()
        wait_for(lambda: _answers(port))
        assert get(port, "/live")[0] == 200
    finally:
        blocker.close()
        server.stop()


def _answers(port: int) -> bool:
    try:
        return get(port, "/live")[0] == 200
    except OSError:
        return False


def test_live_goes_stale_without_beats(config: Config) -> None:
    now = [100.0]
    beat: list[float | None] = [None]
    checks = HealthChecks(config, last_beat=lambda: beat[0], quiet=lambda: False,
                          clock=lambda: now[0])
    assert checks.live()[0] == 503  # never beat
    beat[0] = 100.0
    now[0] = 100.0 + 3 * config.heartbeat_interval
    assert checks.live()[0] == 200
    now[0] += 0.01
    status, body = checks.live()
    assert status == 503 and body["status"] == "stale"


@pytest.mark.parametrize(("raw", "expected"), [
    ("127.0.0.1:9100", ("127.0.0.1", 9100)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
    (":9100", ("127.0.0.1", 9100)),
    ("9100", ("127.0.0.1", 9100)),
    ("[::1]:9100", ("::1", 9100)),
])
def test_parse_listen(raw: str, expected: tuple[str, int]) -> None:
    assert parse_listen(raw) == expected


@pytest.mark.parametrize("raw", ["host:abc", "127.0.0.1:70000", "::1:80", "", "x:-1"])
def test_bad_health_listen_is_named(raw: str) -> None:
    with pytest.raises(ConfigError, match="health_listen"):
        Config(health_listen=raw)


def test_listen_address_adds_the_index_to_fixed_ports_only() -> None:
    assert listen_address("127.0.0.1:9100", 3) == ("127.0.0.1", 9103)
    assert listen_address(":0", 3) == ("127.0.0.1", 0)
    with pytest.raises(ValueError, match="65535"):
        listen_address(":65535", 1)


def write_topology(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(body, encoding="utf-8")
    return path


def test_topology_refuses_overlapping_health_ports(tmp_path: Path) -> None:
    path = write_topology(tmp_path, """
        [wurk]
        health_listen = "127.0.0.1:9100"
        [[slot]]
        name = "a"
        count = 2
        [[slot]]
        name = "b"
        health_listen = "127.0.0.1:9101"
    """)
    with pytest.raises(TopologyError, match=r"slot 'b'.*health_listen.*9101.*slot 'a'"):
        load(path)


def test_topology_takes_per_slot_health_ports(tmp_path: Path) -> None:
    path = write_topology(tmp_path, """
        [wurk]
        health_listen = "127.0.0.1:9100"
        [[slot]]
        name = "a"
        count = 2
        [[slot]]
        name = "b"
        count = 3
        health_listen = "127.0.0.1:9200"
        [[slot]]
        name = "c"
        count = 4
        health_listen = ":0"
    """)
    slots = {slot.name: slot.config.health_listen for slot in load(path).slots}
    assert slots == {"a": "127.0.0.1:9100", "b": "127.0.0.1:9200", "c": ":0"}


def test_live_uses_heartbeat_intervals(redis_server: RedisServer) -> None:
    checks = HealthChecks(Config(redis_url=redis_server.url, heartbeat_interval=2.0),
                          last_beat=lambda: 0.0, quiet=lambda: False, clock=lambda: 5.9)
    status, body = checks.live()
    assert status == 200 and body["limit"] == 6.0 and body["beat_age"] == 5.9

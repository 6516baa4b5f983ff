"""Metrics: statsd/DogStatsD packets on a real UDP socket, fork resets, Prometheus text."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import free_port

import wurk
from supervisor.child_boot import reset_after_fork
from supervisor.topology import Slot
from wurk.observe import metrics
from wurk.push.job import registry
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config, ConfigError


class Receiver:
    """A statsd agent stand-in: a UDP socket bound by the test."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"udp://127.0.0.1:{self.port}"

    def packets(self, timeout: float) -> list[tuple[str, int]]:
        """(datagram, sender port) for everything that arrives within ``timeout``."""
        got: list[tuple[str, int]] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.sock], [], [], left)[0]:
                data, sender = self.sock.recvfrom(65536)
                got.append((data.decode(), sender[1]))
        return got

    def lines_until(self, predicate: Callable[[list[str]], bool],
                    timeout: float = 5.0) -> list[str]:
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while not predicate(lines):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"statsd lines never matched; got {lines!r}")
            if select.select([self.sock], [], [], left)[0]:
                lines += self.sock.recv(65536).decode().split("\n")
        return lines


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    yield rx
    rx.sock.close()


@pytest.fixture(autouse=True)
def _fresh_metrics() -> Iterator[None]:
    metrics.reset()
    yield
    metrics.reset()


@pytest.fixture
def jobs(r: redis.Redis) -> Iterator[tuple[str, str]]:
    ok, bad = (f"metrics_{kind}_{uuid.uuid4().hex[:6]}" for kind in ("ok", "bad"))

    @wurk.job(name=ok)
    def succeed() -> None:
        time.sleep(0.03)
        r.rpush("metrics:done", "ok")

    @wurk.job(name=bad)
    def fail() -> None:
        r.rpush("metrics:done", "bad")
        raise ValueError("nope")

    yield ok, bad
    registry.discard(ok)
    registry.discard(bad)


def run_jobs(config: Config, r: redis.Redis, jobs: tuple[str, str]) -> None:
    client = wurk.Client(config)
    client.push({"class": jobs[0], "args": []})
    client.push({"class": jobs[1], "args": [], "retry": 0})
    deadline = time.monotonic() + 5
    while r.llen("metrics:done") < 2:
        assert time.monotonic() < deadline, "jobs did not run"
        time.sleep(0.02)


def test_job_metrics_fold_tags_into_names(config: Config, r: redis.Redis, receiver: Receiver,
                                          jobs: tuple[str, str],
                                          launch_with: Callable[..., Launcher]) -> None:
    on = dataclasses.replace(config, metrics_url=receiver.url, heartbeat_interval=60)
    launcher = launch_with(on)
    assert "metrics" in [step.name for step in launcher.manager.lifecycle.steps]
    run_jobs(on, r, jobs)
    ok, bad = (f"class.{name}.queue.default" for name in jobs)
    lines = receiver.lines_until(
        lambda got: sum(line.startswith("wurk.jobs.duration.") for line in got) == 2)
    assert f"wurk.jobs.processed.{ok}:1|c" in lines
    assert f"wurk.jobs.processed.{bad}:1|c" in lines
    assert f"wurk.jobs.failed.{bad}:1|c" in lines
    assert not any(line.startswith(f"wurk.jobs.failed.{ok}") for line in lines)
    duration = next(line for line in lines if line.startswith(f"wurk.jobs.duration.{ok}:"))
    value, kind = duration.split(":", 1)[1].split("|")
    assert kind == "ms" and 30 <= float(value) < 5000


def test_job_metrics_dogstatsd_tags(config: Config, r: redis.Redis, receiver: Receiver,
                                    jobs: tuple[str, str],
                                    launch_with: Callable[..., Launcher]) -> None:
    on = dataclasses.replace(config, metrics_url=receiver.url, metrics_dogstatsd=True,
                             heartbeat_interval=60)
    launch_with(on)
    run_jobs(on, r, jobs)
    lines = receiver.lines_until(
        lambda got: sum(line.startswith("wurk.jobs.duration:") for line in got) == 2)
    ok_tags, bad_tags = (f"#class:{name},queue:default" for name in jobs)
    assert f"wurk.jobs.processed:1|c|{ok_tags}" in lines
    assert f"wurk.jobs.failed:1|c|{bad_tags}" in lines
    assert any(line.startswith("wurk.jobs.duration:") and line.endswith(f"|ms|{ok_tags}")
               for line in lines)


def test_each_beat_sends_queue_latency_and_rss_once(config: Config, r: redis.Redis,
                                                    receiver: Receiver) -> None:
    on = dataclasses.replace(config, metrics_url=receiver.url, queues=["default", "low"],
                             heartbeat_interval=60)
    r.lpush("queue:low", json.dumps({"class": "Old", "args": [], "jid": "x",
                                     "enqueued_at": time.time() - 30}))
    launcher = Launcher(on, extra_info={"slot": "web", "index": 2})  # not started: beats by hand
    try:
        for _ in range(3):
            launcher.heartbeat.beat()
        lines = [line for packet, _ in receiver.packets(0.5) for line in packet.split("\n")]
    finally:
        launcher.heartbeat.stop()
    rss = [line for line in lines if line.startswith("wurk.process.rss.")]
    assert len(rss) == 3
    assert all(line.startswith("wurk.process.rss.slot.web.index.2:") for line in rss)
    assert int(rss[0].split(":")[1].removesuffix("|g")) > 1_000_000  # bytes, not KB
    latency = {line.split(":")[0]: float(line.split(":")[1].removesuffix("|g"))
               for line in lines if line.startswith("wurk.queue.latency.")}
    assert set(latency) == {"wurk.queue.latency.queue.default", "wurk.queue.latency.queue.low"}
    assert latency["wurk.queue.latency.queue.default"] == 0
    assert 29 <= latency["wurk.queue.latency.queue.low"] < 60
    assert sum(line.startswith("wurk.queue.latency.queue.low:") for line in lines) == 3


def test_metrics_off_sends_nothing_and_adds_nothing(
        config: Config, r: redis.Redis, receiver: Receiver, jobs: tuple[str, str],
        launch_with: Callable[..., Launcher], monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    monkeypatch.setattr(metrics.StatsdSender, "__init__",
                        lambda self, *a: made.append(a))  # any sender at all is a failure
    assert config.metrics_url is None and metrics.for_config(config) is None
    # Per-class metrics (class_metrics, on by default) wrap the run too: off here.
    launcher = launch_with(dataclasses.replace(config, class_metrics=False))
    names = [step.name for step in launcher.manager.lifecycle.steps]
    assert "metrics" not in names and "class_metrics" not in names  # no figures taken at all
    assert launcher.heartbeat.on_beat is None
    run_jobs(config, r, jobs)
    launcher.heartbeat.beat()
    assert receiver.packets(0.3) == []
    assert made == []


def test_send_errors_are_counted_never_raised() -> None:
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nobody listens: the kernel answers with ICMP port unreachable
    sender = metrics.StatsdSender("127.0.0.1", port)
    observed = metrics.Metrics(sender)
    for _ in range(5):
        observed.job("C", "q", 1.0, failed=False)
        time.sleep(0.02)
    assert sender.send_errors >= 1
    sender.reset()
    assert sender.send_errors == 0 and sender.sock is None


def test_after_fork_the_child_sends_from_its_own_socket(config: Config,
                                                        receiver: Receiver) -> None:
    on = dataclasses.replace(config, metrics_url=receiver.url)
    observed = metrics.for_config(on)
    assert observed is not None and observed.sender is not None
    observed.gauges([("wurk.test", 1, ())])
    parent_sock = observed.sender.sock
    assert parent_sock is not None
    parent_port = parent_sock.getsockname()[1]
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        try:
            forgot = observed.sender.sock is None  # the at-fork hook ran
            reset_after_fork(Slot("m", 1, on))      # and child boot's explicit reset
            observed.gauges([("wurk.test", 2, ())])
            sock = observed.sender.sock
            port = sock.getsockname()[1] if sock is not None else 0
            os.write(report_w, json.dumps({"forgot": forgot, "port": port}).encode())
        finally:
            os._exit(0)
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    child = json.loads(os.read(report_r, 1000))
    os.close(report_r)
    assert status == 0 and child["forgot"] is True
    assert child["port"] not in (0, parent_port)
    observed.gauges([("wurk.test", 3, ())])
    got = receiver.packets(0.5)
    assert ("wurk.test:1|g", parent_port) in got
    assert ("wurk.test:2|g", child["port"]) in got
    assert ("wurk.test:3|g", parent_port) in got  # the parent's socket still works
    assert observed.sender.sock is parent_sock


def test_prometheus_text_on_the_health_listener(config: Config, r: redis.Redis,
                                                jobs: tuple[str, str],
                                                launch_with: Callable[..., Launcher]) -> None:
    on = dataclasses.replace(config, metrics_prometheus=True, health_listen="127.0.0.1:0")
    launcher = launch_with(on, extra_info={"slot": "a", "index": 0})
    run_jobs(on, r, jobs)
    launcher.heartbeat.beat()
    assert launcher.health is not None
    url = f"http://127.0.0.1:{launcher.health.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        kind = reply.headers["Content-Type"]
        text = reply.read().decode()
    assert kind.startswith("text/plain; version=0.0.4")
    ok, bad = (f'class="{name}",queue="default"' for name in jobs)
    assert f"wurk_jobs_processed_total{{{ok}}} 1" in text
    assert f"wurk_jobs_processed_total{{{bad}}} 1" in text
    assert f"wurk_jobs_failed_total{{{bad}}} 1" in text
    assert f"wurk_jobs_failed_total{{{ok}}} 0" in text
    assert f"wurk_jobs_duration_seconds_count{{{ok}}} 1" in text
    assert 'wurk_queue_latency_seconds{queue="default"}' in text
    assert 'wurk_process_rss_bytes{slot="a",index="0"}' in text
    assert "# TYPE wurk_jobs_processed_total counter" in text


def test_formatting_rules() -> None:
    tags = (("class", "App::Mailer"), ("queue", "a,b|c"))
    assert (metrics.format_metric("wurk.jobs.processed", 1, "c", tags, dogstatsd=False)
            == "wurk.jobs.processed.class.App__Mailer.queue.a_b_c:1|c")
    assert (metrics.format_metric("wurk.jobs.duration", 1.23456, "ms", tags, dogstatsd=True)
            == "wurk.jobs.duration:1.235|ms|#class:App::Mailer,queue:a_b_c")
    assert metrics.format_metric("g", 5, "g", (), dogstatsd=True) == "g:5|g"
    chunks = metrics.packets([f"wurk.queue.latency.queue.q{i}:1|g" for i in range(200)], 500)
    assert len(chunks) > 1 and all(len(chunk) <= 500 for chunk in chunks)
    assert sum(chunk.count(b"\n") + 1 for chunk in chunks) == 200
    assert metrics.job_class({"class": "Wrapper", "wrapped": "Real"}) == "Real"
    assert metrics.process_tags({"slot": "a", "index": 1, "pid": 3}) == (("slot", "a"),
                                                                        ("index", "1"))


@pytest.mark.parametrize(("settings", "key"), [
    ({"metrics_url": "http://127.0.0.1:8125"}, "metrics_url"),
    ({"metrics_url": "udp://127.0.0.1"}, "metrics_url"),
    ({"metrics_url": "udp://127.0.0.1:99999"}, "metrics_url"),
    ({"metrics_prometheus": True}, "metrics_prometheus"),
    ({"profile_ttl": 0}, "profile_ttl"),
])
def test_bad_metric_settings_are_named(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Config(**settings)


def test_metric_settings_from_the_environment() -> None:
    config = Config.load(env={"WURK_METRICS_URL": f"udp://localhost:{free_port()}",
                              "WURK_METRICS_DOGSTATSD": "true", "WURK_PROFILE_TTL": "60"})
    assert config.metrics_dogstatsd is True and config.profile_ttl == 60
    assert config.metrics_url is not None and config.metrics_url.startswith("udp://localhost:")

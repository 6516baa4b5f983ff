"""Per-class metrics: what workers record (Sidekiq 8's or 7's keys) and the Metrics pages."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from waiting import wait_for
from webpages import ruby_process

import wurk
import wurk.web
from wurk.api.class_metrics import ClassMetricsQuery
from wurk.observe.class_metrics import (
    ROLLUP_TTL,
    TTL,
    ClassMetrics,
    bucket_of,
    flush_commands,
    histogram_key,
    histogram_key8,
    minute_key,
    minute_key8,
    rollup_key,
    tracked,
)
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

MINUTE_KEY = {"sidekiq7": re.compile(r"^j\|\d{8}\|\d{1,2}:\d{1,2}$"),
              "sidekiq8": re.compile(r"^j\|\d{6}\|\d{1,2}:\d{1,2}$")}  # minute and rollup


@pytest.fixture
def web(config: Config) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def ruby7_writes(r: redis.Redis, cls: str, at: datetime, *, p: int, f: int, ms: int,
                 buckets: dict[int, int]) -> None:
    """What Sidekiq 7.x's ExecutionTracker#flush writes for one class and minute."""
    minute = f"j|{at.strftime('%Y%m%d')}|{at.hour}:{at.minute}"
    hist = f"{cls}-{at.strftime('%d-%H')}:{at.minute}"
    for suffix, value in (("ms", ms), ("p", p), ("f", f)):
        r.hincrby(minute, f"{cls}|{suffix}", value)
    r.expire(minute, 8 * 3600)
    args: list[Any] = [hist, "OVERFLOW", "SAT"]
    for index, count in buckets.items():
        args += ["INCRBY", "u16", f"#{index}", count]
    r.execute_command("BITFIELD", *args)
    r.expire(hist, 8 * 3600)


def test_key_names_and_buckets_are_sidekiqs() -> None:
    at = datetime(2026, 11, 3, 7, 4, tzinfo=UTC)
    assert minute_key(at) == "j|20261103|7:4"  # Sidekiq 7.x
    assert histogram_key("Mailer", at) == "Mailer-03-07:4"
    # Sidekiq 8.0.8 lib/sidekiq/metrics/tracking.rb and shared.rb
    assert minute_key8(at) == "j|261103|7:04"
    assert rollup_key(at) == "j|261103|7:0"
    assert rollup_key(datetime(2026, 11, 3, 17, 59, tzinfo=UTC)) == "j|261103|17:5"
    assert histogram_key8("Mailer", at) == "h|Mailer-3-7:4"
    # Sidekiq: the first bucket whose bound is above the time (20 ms goes in "30ms").
    assert [bucket_of(ms) for ms in (0, 19, 20, 280, 334_999, 335_000, 10**9)] == [
        0, 0, 1, 7, 24, 25, 25]


def test_flush_commands_add_up_and_saturate() -> None:
    recorder = ClassMetrics()
    for ms in (5, 5, 300):
        recorder.record("A", ms, failed=False)
    recorder.record("A", 9999, failed=True)
    taken = recorder.take()
    assert recorder.take() == {}
    counts = taken["A"]
    assert (counts.processed, counts.failed, counts.ms) == (4, 1, 310)
    assert counts.histogram[0] == 2 and counts.histogram[7] == 1 and sum(counts.histogram) == 3
    recorder.give_back(taken)
    recorder.give_back(taken)
    assert recorder.take()["A"].processed == 8
    counts.histogram[0] = 70_000
    commands = flush_commands(taken, now=0, layout="sidekiq7")
    assert ("HINCRBY", "j|19700101|0:0", "A|p", 4) in commands
    assert ("BITFIELD", "A-01-00:0", "OVERFLOW", "SAT", "INCRBY", "u16", "#0", 65535,
            "INCRBY", "u16", "#7", 1) in commands
    assert commands[-1] == ("EXPIRE", "j|19700101|0:0", TTL)
    assert not [c for c in commands if "j|700101" in str(c)]
    commands = flush_commands(taken, now=600 + 7 * 60)
    for key in ("j|700101|0:17", "j|700101|0:1"):
        assert ("HINCRBY", key, "A|p", 4) in commands and ("HINCRBY", key, "A|f", 1) in commands
    assert ("BITFIELD", "h|A-1-0:17", "OVERFLOW", "SAT", "INCRBY", "u16", "#0", 65535,
            "INCRBY", "u16", "#7", 1) in commands
    assert commands[-2:] == [("EXPIRE", "j|700101|0:17", TTL),
                             ("EXPIRE", "j|700101|0:1", ROLLUP_TTL)]
    assert flush_commands({}) == []
    with pytest.raises(ValueError, match="class_metrics_format"):
        flush_commands(taken, layout="sidekiq9")


def test_off_leaves_the_run_untouched(config: Config) -> None:
    def run(job: dict[str, Any], queue: str, entry: None) -> None:
        return None

    off = Config(redis_url=config.redis_url, class_metrics=False)
    assert tracked(off, ClassMetrics(), run) is run
    assert tracked(config, ClassMetrics(), run) is not run


@pytest.mark.parametrize("layout", ["sidekiq8", "sidekiq7"])
def test_a_worker_writes_sidekiqs_keys_once_per_beat(
        config: Config, r: redis.Redis, launch_with: Callable[..., Launcher],
        define: Callable[..., Any], layout: str) -> None:
    ok = define(lambda: time.sleep(0.03))
    bad = define(lambda: 1 / 0, retry=False)
    for _ in range(3):
        ok.perform_async()
    for _ in range(2):
        bad.perform_async()
    launch_with(dataclasses.replace(config, class_metrics_format=layout))
    query = ClassMetricsQuery(config=config)

    def settled() -> bool:
        found = {t.name: t for t in query.top(1)}
        return (ok.name in found and found[ok.name].processed == 3
                and bad.name in found and found[bad.name].failed == 2)

    deadline = time.monotonic() + 15
    while not settled():
        assert time.monotonic() < deadline, query.top(1)
        time.sleep(0.1)
    found = {t.name: t for t in query.top(1)}
    assert found[ok.name].ms >= 3 * 30 and found[ok.name].failed == 0
    assert found[bad.name].processed == 2 and found[bad.name].ms == 0
    minutes = [k for k in r.keys("j|*")]
    assert minutes and all(MINUTE_KEY[layout].match(k) for k in minutes)
    # Sidekiq 8's 10-minute rollup ends in the minute's tens (one digit), its
    # minute hash in the padded minute; Sidekiq 7 has minute hashes only.
    rollups = [k for k in minutes if layout == "sidekiq8" and len(k.rsplit(":", 1)[1]) == 1]
    assert all(0 < r.ttl(k) <= (ROLLUP_TTL if k in rollups else TTL) for k in minutes)
    assert all(r.ttl(k) > TTL for k in rollups)
    assert layout == "sidekiq7" or rollups
    assert sum(query.for_class(ok.name).histogram) == 3
    assert sum(query.for_class(bad.name).histogram) == 0  # failures are not timed
    grams = r.keys(f"h|{ok.name}-*" if layout == "sidekiq8" else f"{ok.name}-*")
    assert grams and all(0 < r.ttl(k) <= TTL for k in grams)
    # The longer windows read the rollups (or Sidekiq 7's minutes): the same figures, once.
    for hours in (2, 8):
        longer = {t.name: t for t in query.top(hours)}
        assert (longer[ok.name].processed, longer[bad.name].failed) == (3, 2)


def test_a_bad_metrics_key_costs_only_the_metrics(
        config: Config, r: redis.Redis, launch: Callable[..., Launcher],
        define: Callable[..., Any]) -> None:
    """A minute hash that is some other type: the beat and the totals go on."""
    now = datetime.now(UTC)
    for seconds in (0, 60):
        r.rpush(minute_key(datetime.fromtimestamp(now.timestamp() + seconds, UTC)), "x")
    ok = define(lambda: None)
    ok.perform_async()
    launcher = launch()
    wait_for(lambda: int(r.get("stat:processed") or 0) >= 1, timeout=30, what="the job ran")
    beat = launcher.heartbeat.last_beat
    # Still beating: a later beat comes (every 0.2 s; the margin is for a loaded machine).
    wait_for(lambda: launcher.heartbeat.last_beat != beat, timeout=20, what="another beat")


def test_reads_what_ruby_sidekiq_7_wrote(config: Config, r: redis.Redis,
                                         web: TestClient) -> None:
    now = datetime.now(UTC)
    earlier = datetime.fromtimestamp(now.timestamp() - 3 * 3600, UTC)
    ruby7_writes(r, "HardWorker", now, p=10, f=2, ms=4000, buckets={3: 5, 10: 3})
    ruby7_writes(r, "HardWorker", earlier, p=7, f=0, ms=700, buckets={0: 7})
    ruby7_writes(r, "Mailer", now, p=1, f=0, ms=12, buckets={0: 1})
    page = web.get("/metrics")
    assert page.status_code == 200
    row = re.search(r"HardWorker</a></td>\s*<td class=\"num\">([\d,]+)</td>\s*"
                    r"<td class=\"num\">([\d,]+)</td>\s*<td class=\"num\">([\d.,]+) s</td>\s*"
                    r"<td class=\"num\">([\d.,]+) ms</td>", page.text)
    assert row and row.groups() == ("10", "2", "4.00", "500.0")
    assert page.text.index("HardWorker") < page.text.index("Mailer")
    four = web.get("/metrics?hours=4").text
    assert re.search(r"HardWorker</a></td>\s*<td class=\"num\">17</td>", four)
    detail = web.get("/metrics/HardWorker?hours=4")
    assert detail.status_code == 200
    data = re.search(r'id="class-data">(.*?)</script>', detail.text)
    assert data
    chart = __import__("json").loads(data.group(1))
    assert chart["histogram"][0] == 7 and chart["histogram"][3] == 5
    assert chart["histogram"][10] == 3 and len(chart["labels"]) == 26
    assert sum(chart["processed"]) == 17 and len(chart["minutes"]) == 240


def test_garbage_in_the_keys_is_skipped(config: Config, r: redis.Redis,
                                        web: TestClient) -> None:
    now = datetime.now(UTC)
    minute = minute_key(now)
    r.hset(minute, mapping={"Ok|p": "3", "Ok|ms": "30", "Bad|p": "lots", "Neg|p": "-4",
                            "nosuffix": "9", "Odd|zz": "1", "<b>x</b>|p": "1"})
    r.rpush(minute_key(datetime.fromtimestamp(now.timestamp() - 60, UTC)), "a list")
    r.set(histogram_key("Ok", now), "short")
    page = web.get("/metrics")
    assert page.status_code == 200
    assert ">Ok</a>" in page.text and "Bad" not in page.text and "Neg" not in page.text
    assert "<b>x</b>" not in page.text and "&lt;b&gt;x&lt;/b&gt;" in page.text
    assert web.get("/metrics/Ok").status_code == 200
    assert web.get("/metrics/" + "x" * 2000).status_code == 404
    assert web.get("/metrics?hours=999").status_code == 200


def test_sidekiq_6_processes_are_named_as_not_recording(config: Config,
                                                        web: TestClient) -> None:
    assert "records no metrics" not in web.get("/metrics").text
    ruby_process(config)
    page = web.get("/metrics").text
    assert "ruby-host:4242" in page and "Sidekiq 6.x, which records no metrics" in page


def test_a_flush_that_never_reached_redis_keeps_its_figures(config: Config) -> None:
    """Redis away at the beat: the figures wait for the next one (given back)."""
    from conftest import free_port

    from wurk.redis.runtime import close_runtime
    from wurk.runtime.heartbeat import Heartbeat
    from wurk.runtime.inflight import Counters, InFlightTable
    from wurk.settings.queues import parse_queues

    away = dataclasses.replace(config, redis_url=f"redis://127.0.0.1:{free_port()}/0",
                               redis_connect_timeout=0.2)
    counters = Counters()
    beat = Heartbeat(away, parse_queues(["default"]), counters=counters,
                     in_flight=InFlightTable(), on_signal=lambda name: None)
    counters.classes.record("Kept", 12, failed=False)
    counters.classes.record("x" * 5000, 12, failed=False)  # too long a name: not recorded
    try:
        with pytest.raises(redis.ConnectionError):
            beat._flush_classes()
    finally:
        close_runtime(away)
    taken = counters.classes.take()
    assert list(taken) == ["Kept"] and taken["Kept"].processed == 1


def test_both_layouts_add_up_once_in_every_window(config: Config, r: redis.Redis) -> None:
    """Ruby Sidekiq 7 (minute keys), wurk and Ruby Sidekiq 8 (minute keys and rollups) on
    one Redis: each run is counted once, over one hour (minutes) and longer (rollups)."""
    now = time.time()
    recorder = ClassMetrics()
    for back in (0, 25, 70, 200, 470):
        at = datetime.fromtimestamp(now - 60 * back, UTC)
        ruby7_writes(r, "Shared", at, p=2, f=1, ms=40, buckets={1: 1})
        for _ in range(3):
            recorder.record("Shared", 5, failed=False)
        recorder.record("Only8", 5, failed=True)
        for command in flush_commands(recorder.take(), now - 60 * back):
            r.execute_command(*command)
    query = ClassMetricsQuery(config=config)
    inside = {1: 2, 2: 3, 4: 4, 8: 5}  # of the minutes written, those in each window
    for hours, runs in inside.items():
        found = {t.name: t for t in query.top(hours, now)}
        assert (found["Shared"].processed, found["Shared"].failed) == (5 * runs, runs), hours
        assert found["Shared"].ms == 40 * runs + 15 * runs
        assert (found["Only8"].processed, found["Only8"].failed) == (runs, runs)
    series = query.for_class("Shared", 1, now)
    assert sum(series.processed) == 10 and sum(series.histogram) == 2 * 1 + 2 * 3

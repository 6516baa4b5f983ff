"""The pages of wurk-only features over HTTP (TestClient) against a real Redis:
Periodic, Limiters and Unique locks, their actions, read-only mode and garbage."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from webfeatures import seed_features, spool_file

import wurk.web
from supervisor.remote import RemoteControl, SwarmSnapshot
from wurk.settings.config import Config


@pytest.fixture
def seeded(config: Config) -> dict[str, Any]:
    return seed_features(config)


@pytest.fixture
def web(config: Config, seeded: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def token(client: TestClient, path: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found, f"no CSRF field on {path}"
    return found.group(1)


@pytest.mark.parametrize(("path", "shown"), [
    ("/periodic", ["nightly-report", "NightlyReport", "*/15 * * * *", "Europe/Paris",
                   "purge-sessions", "paused", "ago"]),
    ("/periodic/nightly-report", ["Next runs", "[1, &#34;full&#34;]", "0" * 23 + "5",
                                  "UTC ("]),
    ("/periodic/purge-sessions", ["None while paused.", "Not fired yet."]),
    ("/limiters", ["stripe-api", "concurrent", "emails", "window", "WRONGTYPE"]),
    ("/unique", ["unique:", "in 59 minutes"]),
])
def test_every_page_shows_its_data(web: TestClient, path: str, shown: list[str]) -> None:
    page = web.get(path)
    assert page.status_code == 200
    for text in shown:
        assert text in page.text, f"{text!r} missing on {path}"


def test_pause_and_unpause_a_periodic_entry(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/periodic")
    assert web.post("/periodic/nightly-report/pause").status_code == 403
    page = web.post("/periodic/nightly-report/pause", data={"csrf": csrf})
    assert page.status_code == 200 and "Paused: the leader skips" in page.text
    assert r.hget("loops:nightly-report", "paused") == "1"
    page = web.post("/periodic/nightly-report/unpause?from=entry", data={"csrf": csrf})
    assert page.url.path == "/periodic/nightly-report"
    assert r.hget("loops:nightly-report", "paused") == "0"
    assert web.post("/periodic/nope/pause", data={"csrf": csrf}).status_code == 404
    assert web.get("/periodic/nope").status_code == 404


def test_reset_a_limiter_needs_its_name(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/limiters")
    assert r.zcard("lmtr-cs:stripe-api") == 1
    assert web.post("/limiters/stripe-api/reset", data={"csrf": csrf}).status_code == 400
    assert r.zcard("lmtr-cs:stripe-api") == 1
    page = web.post("/limiters/stripe-api/reset", data={"csrf": csrf, "confirm": "stripe-api"})
    assert "Limiter reset" in page.text and r.zcard("lmtr-cs:stripe-api") == 0
    assert r.sismember("lmtr-list", "stripe-api")
    page = web.post("/limiters/broken/reset", data={"csrf": csrf, "confirm": "broken"})
    assert page.status_code == 409 and "cannot be read" in page.text
    assert web.post("/limiters/nope/reset",
                    data={"csrf": csrf, "confirm": "nope"}).status_code == 404


def test_release_a_unique_lock(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/unique")
    keys = sorted(r.keys("unique:*"))
    assert len(keys) == 3
    page = web.post("/unique/release", data={"csrf": csrf, "key": keys[0]})
    assert "Lock released" in page.text and not r.exists(keys[0]) and r.exists(keys[1])
    page = web.post("/unique/release", data={"csrf": csrf, "key": keys[0]})
    assert "already gone" in page.text
    for bad in ("queue:feeds", "x" * 5000):
        assert web.post("/unique/release", data={"csrf": csrf, "key": bad}).status_code == 400
    assert r.exists("queue:feeds")
    assert web.post("/unique/release", data={"csrf": csrf}).status_code == 400


def test_read_only_shows_no_buttons_and_refuses(config: Config, seeded: Any,
                                                r: redis.Redis) -> None:
    with TestClient(wurk.web.app(config, read_only=True)) as client:
        spool_file(config, 1)
        for path in ("/periodic", "/periodic/nightly-report", "/limiters", "/unique", "/spool"):
            page = client.get(path)
            assert page.status_code == 200 and 'method="post"' not in page.text
        client.get("/")
        csrf = client.cookies.get("wurk_csrf")
        assert client.post("/periodic/nightly-report/pause",
                           data={"csrf": csrf}).status_code == 403
    assert r.hget("loops:nightly-report", "paused") == "0"


def test_garbage_and_html_in_redis_render_escaped(web: TestClient, r: redis.Redis) -> None:
    r.sadd("periodic", "<img src=x onerror=alert(1)>")
    r.hset("loops:<img src=x onerror=alert(1)>",
           mapping={"schedule": "<script>", "klass": "<b>K</b>", "options": "{nope", "tz": "Mars"})
    r.lpush("loop-history:nightly-report", "garbage")
    r.sadd("lmtr-list", "<svg onload=alert(1)>")
    r.set("unique:<i>x</i>", "<script>alert(1)</script>")
    for path in ("/periodic", "/periodic/nightly-report", "/limiters", "/unique"):
        page = web.get(path)
        assert page.status_code == 200
        assert "<img src=x" not in page.text and "<svg" not in page.text
        assert "<script>alert" not in page.text and "<b>K</b>" not in page.text
    assert web.get("/periodic/" + "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E").status_code == 200


def test_spool_lists_shows_pushes_and_discards(config: Config, web: TestClient,
                                               r: redis.Redis) -> None:
    assert "The spool is empty." in web.get("/spool").text
    first = spool_file(config, 3)
    second = spool_file(config, 2, klass="Refund")
    elsewhere = spool_file(config, 1, target="redis://other:6379/0")
    page = web.get("/spool")
    assert first.name in page.text and "another Redis" in page.text
    assert "machine running this dashboard" in page.text
    detail = web.get(f"/spool/{second.name}")
    assert "Refund" in detail.text and "&lt;b&gt;bold&lt;/b&gt;" in detail.text
    assert "<b>bold</b>" not in detail.text
    csrf = token(web, "/spool")
    before = r.llen("queue:default")
    page = web.post("/spool/discard", data={"csrf": csrf, "file": second.name})
    assert "Spool file discarded." in page.text and not second.exists()
    assert r.llen("queue:default") == before
    page = web.post("/spool/push", data={"csrf": csrf})
    assert "Spool pushed: 3 jobs." in page.text
    assert r.llen("queue:default") == before + 3 and not first.exists()
    assert elsewhere.exists()  # written for another Redis: left for its own workers
    for bad in ("../../etc/passwd", "nope.spool", ""):
        assert web.post("/spool/discard",
                        data={"csrf": csrf, "file": bad}).status_code in (400, 404)
    assert web.get("/spool/nope.spool").status_code == 404


def test_a_bad_spool_file_shows_its_flaw(config: Config, web: TestClient) -> None:
    path = spool_file(config, 1)
    path.write_text('{"wurk_spool": 1}\nnot json\n')
    assert web.get("/spool").status_code == 200
    detail = web.get(f"/spool/{path.name}")
    assert detail.status_code == 200 and 'class="error"' in detail.text


def test_scale_one_slot_and_restarts_on_the_swarms_page(config: Config, web: TestClient,
                                                        r: redis.Redis) -> None:
    control = RemoteControl(config, Path("t.toml"), lambda name: None)
    control.refresh(SwarmSnapshot({"alpha": 2, "beta": 1}, [], "running",
                                  {"alpha": {"1": 3}}))
    page = web.get("/swarms")
    assert 'aria-label="One more child in slot alpha"' in page.text
    csrf = token(web, "/swarms")
    signals = f"{control.identity}-signals"
    page = web.post("/swarms/more", data={"csrf": csrf, "identity": control.identity,
                                          "slot": "alpha"})
    assert "one more child in that slot" in page.text
    web.post("/swarms/fewer", data={"csrf": csrf, "identity": control.identity, "slot": "beta"})
    web.post("/swarms/more", data={"csrf": csrf, "identity": control.identity})
    assert r.lrange(signals, 0, -1) == ["TTIN", "TTOU:beta", "TTIN:alpha"]
    assert web.post("/swarms/more", data={"csrf": csrf, "identity": control.identity,
                                          "slot": "gamma"}).status_code == 404
    assert r.llen(signals) == 3

"""The Batches and Workflows pages over HTTP (TestClient) against a real Redis:
real batches and a workflow run by an in-process Launcher (tests/webbatches.py),
then garbage and HTML written straight into their keys."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from webbatches import seed_batches

import wurk
import wurk.web
from wurk.settings.config import Config


@pytest.fixture
def seeded(config: Config) -> dict[str, Any]:
    return seed_batches(config)


@pytest.fixture
def web(config: Config, seeded: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def clean(text: str) -> None:
    assert "<img src=x" not in text and "<script>" not in text.split("</head>")[1]


def test_the_batches_list_shows_state_counts_and_callbacks(
        web: TestClient, seeded: dict[str, Any]) -> None:
    page = web.get("/batches")
    assert page.status_code == 200
    text = page.text
    for bid in (seeded["nightly"], seeded["child"], seeded["left"], seeded["workflow"]):
        assert f'/batches/{bid}"' in text
    assert "abandoned" in text and "complete" in text and "nightly import 42" in text
    assert "6 / 8" in text and "none yet" in text
    assert "in 29 days" in text or "in 1 month" in text  # the 30 days' expiry, to the second
    assert "&lt;img src=x" in text
    clean(text)
    assert 'href="/batches"' in text and 'aria-current' in text


def test_one_batch_shows_failures_children_and_its_parent(
        web: TestClient, seeded: dict[str, Any], r: redis.Redis) -> None:
    page = web.get(f"/batches/{seeded['nightly']}")
    assert page.status_code == 200
    text = page.text
    failing = sorted(r.hkeys(f"b-{seeded['nightly']}-failinfo"))
    assert len(failing) == 2
    for jid in failing:
        assert f"/retries?q={jid}" in text
    assert "ValueError" in text and "row 3: bad date &lt;img" in text
    assert f"/batches/{seeded['child']}" in text
    assert '{&#34;args&#34;: [42], &#34;job&#34;: &#34;ImportDone&#34;' in text
    assert "fired" in text
    clean(text)
    child = web.get(f"/batches/{seeded['child']}").text
    assert f'/batches/{seeded["nightly"]}"' in child and "Parent" in child
    assert web.get("/batches/nope").status_code == 404
    assert web.get("/batches/" + "x" * 300).status_code == 404


def test_the_workflow_pages_show_each_step(web: TestClient, seeded: dict[str, Any]) -> None:
    listing = web.get("/workflows").text
    assert f"/workflows/{seeded['workflow']}" in listing and "feed refresh" in listing
    assert "stopped" in listing or "failed" in listing
    page = web.get(f"/workflows/{seeded['workflow']}")
    assert page.status_code == 200
    text = page.text
    assert "FetchFeed" in text and "ParseFeed" in text and "report" in text
    assert "succeeded" in text and "KeyError" in text and "skipped" in text
    clean(text)
    root = web.get(f"/batches/{seeded['workflow']}").text
    assert f"/workflows/{seeded['workflow']}" in root
    assert web.get("/workflows/nope").status_code == 404


def test_garbage_batch_and_workflow_records_render_escaped(
        web: TestClient, seeded: dict[str, Any], r: redis.Redis) -> None:
    now = 1_800_000_000
    r.zadd("batches", {"<svg onload=alert(1)>": now, "garbled": now, "wrongtype": now,
                       "x" * 200: now})
    r.hset("b-<svg onload=alert(1)>", mapping={
        "description": "<script>alert(1)</script>", "total": "lots", "pending": "1e999",
        "created_at": "inf", "updated_at": "nan", "callbacks": "{nope",
        "complete_at": "-inf", "parent_bid": "<b>p</b>", "workflow": "[1"})
    r.hset("b-garbled", mapping={"total": "9" * 40, "created_at": "1e999",
                                 "callbacks": '"just a string"', "workflow": '{"steps": 1}'})
    r.sadd("b-garbled-kids", "<i>kid</i>")
    r.hset("b-garbled-failinfo", "<u>jid</u>", '{"class": ["x"], "message": {"a": 1}}')
    r.hset("b-garbled-failinfo", "jid2", "not json")
    r.set("b-wrongtype", "a string")
    r.set(f"b-{seeded['nightly']}-failed", "not a set")
    for path in ("/batches", "/batches/%3Csvg%20onload%3Dalert(1)%3E", "/batches/garbled",
                 "/batches/wrongtype", f"/batches/{seeded['nightly']}"):
        page = web.get(path)
        assert page.status_code in (200, 404), path
        assert "<svg" not in page.text and "<b>p</b>" not in page.text, path
        assert "<i>kid</i>" not in page.text and "<u>jid</u>" not in page.text, path
        clean(page.text)
    assert "unreadable" in web.get("/batches").text or "problems" in web.get("/batches").text
    assert "is not a number" in web.get("/batches/%3Csvg%20onload%3Dalert(1)%3E").text
    assert "&#34;just a string&#34;" in web.get("/batches/garbled").text
    wid = seeded["workflow"]
    r.zadd("wurk:workflows", {"<svg onload=alert(2)>": now, "bad-meta": now})
    r.set("wurk:wf:bad-meta", "not a hash")
    r.hset(f"wurk:wf:{wid}:steps", "report", "{garbage")
    listing = web.get("/workflows")
    assert listing.status_code == 200 and "<svg" not in listing.text
    assert "unreadable" in listing.text and "expired" in listing.text
    assert "unreadable" in web.get(f"/workflows/{wid}").text
    definition = r.hget(f"b-{wid}", "workflow")
    r.hset(f"b-{wid}", "workflow", "<svg onload=alert(3)>")
    page = web.get(f"/workflows/{wid}")
    assert page.status_code == 404 and "<svg" not in page.text and "unusable" in page.text
    r.hset(f"b-{wid}", "workflow", definition or "")
    r.delete(f"wurk:wf:{wid}:steps")
    r.set(f"wurk:wf:{wid}:steps", "a string")
    page = web.get(f"/workflows/{wid}")
    assert page.status_code == 409 and "unreadable" in page.text


def test_the_lists_page_through_the_index(config: Config, web: TestClient) -> None:
    for n in range(30):
        wurk.Batch(f"bulk {n:02d}").commit()
    first = web.get("/batches").text
    assert "bulk 29" in first and "Page 1 of 2" in first and "bulk 00" not in first
    second = web.get("/batches?page=2").text
    assert "bulk 00" in second and "bulk 29" not in second
    assert web.get("/batches?page=zz").status_code == 200
    assert "Page 2 of 2" in web.get("/batches?page=99").text



def pending_links(text: str) -> list[str]:
    section = text.split('id="batch-pending"')[1].split("</p>")[0]
    return re.findall(r'href="/retries\?q=([0-9a-f]+)"', section)


def test_one_batch_lists_its_pending_jids_each_linked_to_a_search(
        web: TestClient, seeded: dict[str, Any], config: Config, r: redis.Redis) -> None:
    failing = sorted(r.hkeys(f"b-{seeded['nightly']}-failinfo"))
    text = web.get(f"/batches/{seeded['nightly']}").text
    assert pending_links(text) == failing  # the failed jobs are what it still waits on
    for jid in failing:
        assert jid in web.get("/retries", params={"q": jid}).text
    parked = [json.loads(raw)["jid"] for raw in r.lrange("queue:parked", 0, -1)]
    assert pending_links(web.get(f"/batches/{seeded['left']}").text) == parked
    done = web.get(f"/batches/{seeded['child']}").text
    assert 'id="batch-pending"' not in done and "Pending jobs" in done

    with wurk.Batch("a big one") as big:
        for n in range(103):
            big.push({"class": "FetchFeed", "queue": "parked", "args": [n]})
    shown = pending_links(web.get(f"/batches/{big.bid}").text)
    assert len(shown) == 100 and shown == sorted(shown)
    assert set(shown) <= {json.loads(raw)["jid"] for raw in r.lrange("queue:parked", 0, -1)}
    assert "Showing 100 of 103." in web.get(f"/batches/{big.bid}").text

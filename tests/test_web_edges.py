"""The dashboard's edges: names that need encoding, pages past the end, wildcards."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient
from webpages import seed

import wurk.web
from wurk.settings.config import Config


@pytest.fixture
def web(config: Config) -> Iterator[TestClient]:
    seed(config)
    with TestClient(wurk.web.app(config)) as client:
        yield client


def token(client: TestClient, path: str = "/queues") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found, "the page has no CSRF field"
    return found.group(1)


def test_a_queue_whose_name_holds_a_slash_opens_pauses_and_clears(
        web: TestClient, r: redis.Redis) -> None:
    wurk.Client().push({"class": "Report", "args": ["monthly"], "queue": "reports/daily"})
    listing = web.get("/queues").text
    assert 'href="http://testserver/queues/reports%2Fdaily"' in listing \
        or 'href="/queues/reports%2Fdaily"' in listing
    page = web.get("/queues/reports%2Fdaily")
    assert page.status_code == 200 and "monthly" in page.text
    csrf = token(web)
    assert web.post("/queues/reports%2Fdaily/pause", data={"csrf": csrf}).status_code == 200
    assert r.smembers("paused") == {"reports/daily"}
    web.post("/queues/reports%2Fdaily/unpause", data={"csrf": csrf})
    assert r.smembers("paused") == set()
    web.post("/queues/reports%2Fdaily/clear", data={"csrf": csrf, "confirm": "reports/daily"})
    assert r.llen("queue:reports/daily") == 0


def test_a_page_past_the_end_shows_the_last_page(web: TestClient, r: redis.Redis) -> None:
    queue = web.get("/queues/default?page=999999").text
    assert "Page 2 of 2" in queue and "Page 999,999" not in queue
    assert "photo-0.png" in queue  # the oldest job, on the last page
    retries = web.get("/retries?page=999999").text
    assert "Page 999,999" not in retries and "SyncAccount" in retries


def test_search_takes_star_and_question_mark_as_wildcards(web: TestClient,
                                                          r: redis.Redis) -> None:
    for n, arg in enumerate(["ab1", "a?1", "axx1", "zzz"]):
        r.zadd("dead", {json.dumps({"class": "Wild", "args": [arg], "jid": f"w{n}"}): n})
    one = web.get("/dead", params={"q": "a?1"}).text
    assert "w0" in one and "w1" in one and "w2" not in one
    many = web.get("/dead", params={"q": "a*1"}).text
    assert all(f"w{n}" in many for n in range(3)) and "w3" not in many


def test_busy_sorts_pids_as_numbers_and_shows_utilisation_and_jids(
        web: TestClient, config: Config) -> None:
    from webpages import ruby_process
    for pid in (11449, 3438):
        identity = f"vm:{pid}:abc"
        ruby_process(config, identity)
        info = {"hostname": "vm", "pid": pid, "started_at": 1, "concurrency": 4,
                "queues": ["default"], "identity": identity}
        wurk.Client(config).pool.call("HSET", identity, "info", json.dumps(info))
    page = web.get("/busy").text
    assert page.index("vm:3438") < page.index("vm:11449")
    assert "Utilization" in page and "25%" in page  # 1 busy of 4
    assert "ruby0000jid" in page
    assert "Quiet All" in page and "Stop All" in page


def test_stop_all_signals_every_process_outside_a_swarm(web: TestClient,
                                                        r: redis.Redis) -> None:
    from webpages import RUBY_IDENTITY
    assert web.post("/busy/stop-all", data={"csrf": token(web, "/busy")}).status_code == 200
    assert r.lrange(f"{RUBY_IDENTITY}-signals", 0, -1) == ["TERM"]
    web.post("/busy/quiet-all", data={"csrf": token(web, "/busy")})
    assert r.lrange(f"{RUBY_IDENTITY}-signals", 0, -1) == ["TSTP", "TERM"]


def test_a_swarm_childs_stop_says_the_swarm_replaces_it(web: TestClient, config: Config,
                                                       r: redis.Redis) -> None:
    identity = "vm:777:child"
    info = {"hostname": "vm", "pid": 777, "started_at": 1, "concurrency": 2,
            "queues": ["default"], "identity": identity, "slot": "web", "index": 0}
    r.sadd("processes", identity)
    r.hset(identity, mapping={"info": json.dumps(info), "busy": 0, "beat": 9e9, "quiet": "false"})
    page = web.get("/busy").text
    assert "the swarm starts a new one in its place" in page


def test_every_single_and_selected_action_asks_first(web: TestClient, r: redis.Redis) -> None:
    listing = web.get("/retries").text
    for label in ("Retry now", "Add to queue", "Delete", "Kill"):
        assert f'data-confirm="{label}: the selected jobs of Retries?"' in listing
    key = re.search(r'href="[^"]*/retries/([^"?]+)"', listing)
    assert key
    entry = web.get(f"/retries/{key.group(1)}").text
    assert entry.count('data-confirm="Delete this job') == 1
    assert entry.count('data-confirm="Kill this job') == 1


def test_texts_read_as_people_write_them(web: TestClient, r: redis.Redis) -> None:
    big = "x" * 1_000_000
    r.zadd("retry", {json.dumps({"class": "Big", "args": [big], "jid": "big1", "retry": True,
                                 "retry_count": 1, "error_class": "E",
                                 "error_message": "m", "failed_at": 1.0}): 5})
    listing = web.get("/retries", params={"q": "big1"}).text
    key = re.search(r'href="[^"]*/retries/([^"?]+)"', listing)
    assert key
    entry = web.get(f"/retries/{key.group(1)}").text
    assert "(1 retry)" in entry and "(1 retries)" not in entry
    assert entry.count(big) == 1 and len(entry) < 1_500_000
    assert "shown under Arguments above" in entry
    icon = web.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")
    assert 'rel="icon"' in web.get("/").text


def test_retries_show_the_retry_count_and_numbered_pages(web: TestClient,
                                                         r: redis.Redis) -> None:
    for n in range(120):
        r.zadd("retry", {json.dumps({"class": "Many", "args": [n], "jid": f"m{n}",
                                     "retry_count": 7, "error_class": "E",
                                     "error_message": "m", "failed_at": 1.0}): 100 + n})
    page = web.get("/retries?page=3&sort=asc").text
    assert '<th scope="col" class="num">Retries</th>' in page
    assert '<td class="num">7</td>' in page
    assert '<strong aria-current="page">3</strong>' in page
    for n in (1, 2, 4, 5, 6):
        assert f'?page={n}&amp;sort=asc">{n}</a>' in page


def test_unique_locks_name_the_job_that_holds_each(config: Config, r: redis.Redis) -> None:
    from webfeatures import seed_features
    seed_features(config)
    with TestClient(wurk.web.app(config)) as client:
        page = client.get("/unique").text
    assert page.count("FeedRefresh") == 3 and page.count("queue feeds") == 3
    # A lock whose holder is gone says so instead of guessing.
    r.set("unique:" + "0" * 64, "nosuchjid", ex=60)
    with TestClient(wurk.web.app(config)) as client:
        assert "it may have just finished" in client.get("/unique").text


def test_a_periodic_entrys_retry_reads_as_words(config: Config) -> None:
    from webfeatures import seed_features
    seed_features(config)
    with TestClient(wurk.web.app(config)) as client:
        page = client.get("/periodic/nightly-report").text
    assert "<dt>Retry</dt><dd>True</dd>" not in page
    assert re.search(r"<dt>Retry</dt><dd>(yes|no|\d+ times?)</dd>", page)

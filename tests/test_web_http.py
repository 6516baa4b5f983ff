"""The dashboard over HTTP (Starlette's TestClient) against a real Redis."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient
from webpages import RUBY_IDENTITY, seed

import wurk.web
from wurk.settings.config import Config


@pytest.fixture
def seeded(config: Config) -> dict[str, object]:
    return seed(config)


@pytest.fixture
def web(config: Config, seeded: dict[str, object]) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def token(client: TestClient, path: str = "/queues") -> str:
    page = client.get(path)
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "the page has no CSRF field"
    return found.group(1)


@pytest.mark.parametrize(("path", "shown"), [
    ("/", ["123,456,789", "4,321", "Redis", "7."]),
    ("/queues", ["default", "mailers", "critical"]),
    ("/queues/default", ["ResizeImage", "photo-29.png", "Page 1 of 2"]),
    ("/queues/mailers", ["SignupMailer#welcome", "42"]),
    ("/retries", ["SyncAccount", "timeout #0", "13 jobs"]),
    ("/scheduled", ["Reminder", "tomorrow"]),
    ("/dead", ["ChargeCard", "card declined"]),
    ("/busy", ["ruby-host:4242", "billing", "ChargeCard", "200 MB", "tid-ruby1"]),
])
def test_every_page_shows_its_data(web: TestClient, path: str, shown: list[str]) -> None:
    page = web.get(path)
    assert page.status_code == 200
    for text in shown:
        assert text in page.text, f"{text!r} missing on {path}"


def test_every_response_carries_the_security_headers(web: TestClient) -> None:
    for path in ("/", "/static/app.css", "/nope", "/stats.json"):
        headers = web.get(path).headers
        assert "default-src 'self'" in headers["content-security-policy"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"


def test_payload_html_is_escaped_everywhere(web: TestClient) -> None:
    for path in ("/queues/default?page=1", "/retries", "/dead", "/busy", "/retries?q=Greeter"):
        text = web.get(path).text
        assert "<script>window" not in text and "<img src=x" not in text
        assert "</script><script>" not in text
    assert "&lt;script&gt;" in web.get("/retries?q=Greeter").text


def test_stats_json_feeds_the_live_graph(web: TestClient) -> None:
    stats = web.get("/stats.json").json()
    assert stats["processed"] == 123456789 and stats["dead"] == 9 and stats["retries"] == 13


def test_a_post_without_the_csrf_token_changes_nothing(web: TestClient, r: redis.Redis) -> None:
    token(web)
    assert web.post("/queues/default/pause").status_code == 403
    assert web.post("/queues/default/pause", data={"csrf": "x" * 43}).status_code == 403
    fresh = TestClient(web.app)  # no cookie at all
    assert fresh.post("/queues/default/pause", data={"csrf": token(web)}).status_code == 403
    assert web.post("/queues/default/pause", data={"csrf": token(web)},
                    headers={"origin": "http://evil.example"}).status_code == 403
    assert not r.sismember("paused", "default")


def test_get_never_changes_state(web: TestClient, r: redis.Redis) -> None:
    assert web.get("/queues/default/pause").status_code in (404, 405)
    assert web.get("/dead/all").status_code == 404
    assert web.request("DELETE", "/queues/default").status_code == 405
    assert not r.sismember("paused", "default") and r.zcard("dead") == 9


def test_pause_unpause_and_clear_a_queue(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web)
    assert web.post("/queues/default/pause", data={"csrf": csrf}).status_code == 200
    assert r.sismember("paused", "default")
    assert "paused" in web.get("/queues").text
    web.post("/queues/default/unpause", data={"csrf": csrf})
    assert not r.sismember("paused", "default")
    assert web.post("/queues/critical/clear", data={"csrf": csrf}).status_code == 400
    assert r.llen("queue:critical") == 1
    web.post("/queues/critical/clear", data={"csrf": csrf, "confirm": "critical"})
    assert r.llen("queue:critical") == 0 and not r.sismember("queues", "critical")


def test_page_through_a_queue_and_delete_one_job(web: TestClient, r: redis.Redis) -> None:
    second = web.get("/queues/default?page=2").text
    assert "photo-0.png" in second and "photo-29.png" not in second
    raw = r.lindex("queue:default", -1)
    jid = json.loads(raw)["jid"]  # type: ignore[arg-type]
    form = {"csrf": token(web), "index": "30", "jid": jid, "page": "2"}
    r.lpush("queue:default", '{"class":"Newer","args":[],"jid":"n1"}')  # the list moved
    assert web.post("/queues/default/delete", data=form).status_code == 200
    assert r.llen("queue:default") == 31 and raw not in r.lrange("queue:default", 0, -1)
    assert "already gone" in web.post("/queues/default/delete", data=form).text
    assert web.post("/queues/default/delete", data={"csrf": form["csrf"]}).status_code == 400


def test_search_a_set(web: TestClient) -> None:
    found = web.get("/retries", params={"q": "timeout #11"}).text
    assert "1 match " in found and "SyncAccount" in found
    assert "No job matches" in web.get("/dead", params={"q": "nothing-like-this"}).text


def _keys(page: str) -> list[str]:
    return re.findall(r'name="key" value="([^"]+)"', page)


def test_entry_page_shows_error_backtrace_and_every_field(web: TestClient) -> None:
    key = _keys(web.get("/retries?q=SyncAccount").text)[0]
    page = web.get(f"/retries/{key}").text
    for text in ("RuntimeError", "app/jobs/syncaccount.py:40:in run", "retry_count",
                 "error_backtrace", "Retry now", "Kill"):
        assert text in page
    assert web.get("/retries/1.5-nosuchjid").status_code == 404


def test_retry_kill_add_and_delete_one_entry(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/retries")
    keys = _keys(web.get("/retries").text)
    web.post(f"/retries/{keys[0]}", data={"csrf": csrf, "action": "retry"})
    web.post(f"/retries/{keys[1]}", data={"csrf": csrf, "action": "kill"})
    assert (r.zcard("retry"), r.zcard("dead"), r.llen("queue:default")) == (11, 10, 32)
    bad = web.post(f"/retries/{keys[2]}", data={"csrf": csrf, "action": "explode"})
    assert bad.status_code == 400
    sched = _keys(web.get("/scheduled").text)[0]
    web.post(f"/scheduled/{sched}", data={"csrf": csrf, "action": "add"})
    assert r.zcard("schedule") == 0 and r.llen("queue:default") == 33


def test_bulk_actions_on_a_selection_and_on_all(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/dead")
    keys = _keys(web.get("/dead").text)[:3]
    done = web.post("/dead", data={"csrf": csrf, "action": "delete", "key": keys})
    assert "Deleted: 3 jobs" in done.text and r.zcard("dead") == 6
    assert web.post("/dead/all", data={"csrf": csrf, "action": "retry"}).status_code == 400
    web.post("/dead/all", data={"csrf": csrf, "action": "retry", "confirm": "all"})
    assert r.zcard("dead") == 0
    assert r.llen("queue:critical") + r.llen("queue:default") == 1 + 31 + 6


def test_quiet_and_stop_send_signals(web: TestClient, r: redis.Redis) -> None:
    csrf = token(web, "/busy")
    web.post("/busy/quiet", data={"csrf": csrf, "identity": RUBY_IDENTITY})
    web.post("/busy/stop", data={"csrf": csrf, "identity": RUBY_IDENTITY})
    assert r.lrange(f"{RUBY_IDENTITY}-signals", 0, -1) == ["TERM", "TSTP"]
    assert web.post("/busy/stop", data={"csrf": csrf, "identity": "nobody"}).status_code == 404


def test_read_only_hides_buttons_and_refuses_posts(config: Config, seeded: object,
                                                   r: redis.Redis) -> None:
    with TestClient(wurk.web.app(config, read_only=True)) as client:
        for path in ("/queues", "/dead", "/busy", "/swarms", "/queues/default"):
            text = client.get(path).text.replace('<button type="submit">Search', "")
            assert "<button" not in text
        client.get("/queues")
        csrf = client.cookies["wurk_csrf"]
        assert client.post("/queues/default/pause", data={"csrf": csrf}).status_code == 403
    assert not r.sismember("paused", "default")


def test_basic_auth(config: Config, seeded: object) -> None:
    with TestClient(wurk.web.app(config, username="ops", password="s3cret")) as client:
        denied = client.get("/")
        assert denied.status_code == 401 and "Basic" in denied.headers["www-authenticate"]
        assert client.get("/", auth=("ops", "wrong")).status_code == 401
        assert client.get("/", headers={"authorization": "Basic !!!"}).status_code == 401
        assert client.get("/", auth=("ops", "s3cret")).status_code == 200
    with pytest.raises(ValueError, match="both"):
        wurk.web.app(config, username="ops")


def test_auth_from_the_settings(redis_server: object, r: redis.Redis) -> None:
    cfg = Config(redis_url=redis_server.url, web_user="u", web_password="p")  # type: ignore[attr-defined]
    with TestClient(wurk.web.app(cfg)) as client:
        assert client.get("/").status_code == 401
        assert client.get("/", auth=("u", "p")).status_code == 200


def test_no_page_shows_the_redis_password(redis_server: object, r: redis.Redis) -> None:
    r.config_set("requirepass", "hunter2hunter2")
    try:
        port = redis_server.port  # type: ignore[attr-defined]
        cfg = Config(redis_url=f"redis://:hunter2hunter2@127.0.0.1:{port}/0")
        with TestClient(wurk.web.app(cfg)) as client:
            assert "hunter2" not in client.get("/").text
        down = Config(redis_url="redis://:hunter2hunter2@127.0.0.1:1/0",
                      redis_retry_attempts=1)
        with TestClient(wurk.web.app(down)) as client:
            page = client.get("/queues")
            assert page.status_code == 503 and "hunter2" not in page.text
            assert "Redis unavailable" in page.text
    finally:
        r.execute_command("AUTH", "hunter2hunter2")
        r.config_set("requirepass", "")


def test_a_missing_extra_is_named() -> None:
    with pytest.raises(wurk.web.MissingExtraError, match=r"wurk\[web\]"):
        wurk.web.require_extra("no_such_module_for_wurk_tests")


def test_search_results_are_paged(web: TestClient, r: redis.Redis) -> None:
    r.zadd("dead", {f'{{"class":"Bulk","args":[{n}],"jid":"bulk{n:03d}","queue":"q"}}': n
                    for n in range(60)})
    first = web.get("/dead", params={"q": "Bulk", "sort": "asc"}).text
    assert "60 matches" in first and "Page 1 of 3" in first
    assert "bulk000" in first and "bulk025" not in first
    assert "q=Bulk" in re.search(r'href="([^"]*page=2[^"]*)"', first).group(1)  # type: ignore[union-attr]
    third = web.get("/dead", params={"q": "Bulk", "sort": "asc", "page": "3"}).text
    assert "bulk059" in third and "bulk049" not in third


def test_json_for_a_script_block_cannot_close_it() -> None:
    import json

    from wurk.web.present import json_for_script

    value = {"a": "</script><script>alert(1)</script>", "b": "&amp; \u2028"}
    encoded = str(json_for_script(value))
    assert "<" not in encoded and ">" not in encoded and "&" not in encoded
    assert json.loads(encoded) == value


def test_times_and_numbers_as_people_read_them() -> None:
    from wurk.web.present import ago, num, utc

    assert num(1234567) == "1,234,567" and num("x") == "x"
    assert ago(100.0, now=280.0) == "3 minutes ago" and ago(400.0, now=280.0) == "in 2 minutes"
    assert ago(None) == "" and utc(0) == "1970-01-01 00:00:00 UTC" and utc(1e300) == "1e+300"


GARBAGE = ["not json at all", "[1, 2]", '{"class": 5, "args": "x", "jid": 7}', "null",
           '{"class": "Big", "args": [1], "enqueued_at": 1e300, "created_at": "soon"}',
           '{"class": "Deep", "args": ' + "[" * 5000 + "]" * 5000 + "}", "\udcff"]


def test_garbage_in_redis_renders_and_is_still_deletable(config: Config, r: redis.Redis) -> None:
    r.sadd("queues", "junk")
    r.rpush("queue:junk", *[g.encode("utf-8", "surrogateescape") for g in GARBAGE])
    r.zadd("dead", {g.encode("utf-8", "surrogateescape"): n for n, g in enumerate(GARBAGE)})
    r.sadd("processes", "bad:1:x", "bad:2:y")
    r.hset("bad:1:x", mapping={"info": "{not json", "busy": "many"})
    r.hset("bad:2:y", mapping={"info": '{"pid": "x", "queues": 5, "started_at": "never"}',
                               "busy": "1", "beat": "nan", "rss": "-5"})
    r.hset("bad:2:y:work", "t1", "garbage")
    r.set("stat:processed", "lots")
    with TestClient(wurk.web.app(config)) as web:
        for path in ("/", "/queues", "/queues/junk", "/dead", "/dead?q=Big", "/busy",
                     "/stats.json", "/dead?page=-3", "/queues/junk?page=abc",
                     "/dead?page=99999999999999999999"):
            assert web.get(path).status_code == 200, path
        keys = re.findall(r'name="key" value="([^"]+)"', web.get("/dead").text)
        assert len(keys) == len(GARBAGE)
        for key in keys:
            assert web.get(f"/dead/{key}").status_code == 200
        csrf = token(web, "/dead")
        moved = web.post("/dead", data={"csrf": csrf, "action": "retry", "key": keys})
        assert "could not be moved" in moved.text
        web.post("/dead", data={"csrf": csrf, "action": "delete", "key": keys})
        assert r.zcard("dead") == 0


def test_swarms_page_and_remote_control(web: TestClient, r: redis.Redis) -> None:
    swarm, child = "box:100:swarm-0123456789ab", "box:101:feedfacecafe"
    r.sadd("wurk:swarms", swarm)
    r.hset(swarm, mapping={
        "info": json.dumps({"hostname": "box", "pid": 100, "started_at": 1.7e9,
                            "topology": "/etc/wurk/<topology>.toml",
                            "slots": {"web": 2, "mail": 1}}),
        "beat": "1700000000.5", "state": "quiet",
        "children": json.dumps([child, "box:102:gone00000000"])})
    r.sadd("processes", child)
    r.hset(child, mapping={"info": json.dumps({"hostname": "box", "pid": 101, "slot": "web",
                                               "index": 0, "queues": ["default"]}),
                           "busy": "3", "beat": "1700000001", "rss": "51200",
                           "concurrency": "10"})
    page = web.get("/swarms").text
    for text in ("box:100", "quiet", "pid 101", "50 MB", "3 / 10", "no live child",
                 "1 registered child without a live heartbeat",
                 "/etc/wurk/&lt;topology&gt;.toml"):
        assert text in page, text
    csrf = token(web, "/swarms")
    for verb in ("quiet", "restart", "more", "fewer", "stop"):
        done = web.post(f"/swarms/{verb}", data={"csrf": csrf, "identity": swarm})
        assert done.status_code == 200
    assert r.lrange(f"{swarm}-signals", 0, -1) == ["TERM", "TTOU", "TTIN", "USR1", "TSTP"]
    assert web.post("/swarms/explode", data={"csrf": csrf, "identity": swarm}).status_code == 404
    assert web.post("/swarms/stop", data={"csrf": csrf, "identity": "nope"}).status_code == 404

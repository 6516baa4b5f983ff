"""Allowed hosts: the matching rules, the setting, and the dashboard mounted in an app.

The rules are pure (wurk.settings.hosts); the app tests drive
``wurk.web.app()`` in process, as a host application mounts it, including
scopes a server without h11's checks (httptools) hands over as they came.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient
from webpages import seed

import wurk.web
from wurk.settings.config import Config, ConfigError
from wurk.settings.hosts import AllowedHosts, bind_pattern, host_of, parse_pattern


@pytest.mark.parametrize(("header", "host"), [
    ("LocalHost:7433", "localhost"), ("localhost.", "localhost"), ("localhost:", "localhost"),
    ("[::1]:80", "[::1]"), ("[0:0::1]", "[::1]"), ("[::FFFF:7F00:1]", "[::ffff:7f00:1]"),
    ("10.0.0.5:1", "10.0.0.5"), ("my_box.lan", "my_box.lan"),
])
def test_a_host_header_is_normalised(header: str, host: str) -> None:
    assert host_of(header) == host


@pytest.mark.parametrize("header", [
    "", ":80", "localhost@evil", "a b", "localhost..", ".localhost", "localhost/x",
    "[::1", "::1", "[fe80::1%lo]", "[::1]x", "[example.com]", "localhost:123456",
    "l\u00f6calhost", "x" * 254, "localhost:80:80",
])
def test_a_malformed_host_header_has_no_host(header: str) -> None:
    assert host_of(header) is None


@pytest.mark.parametrize(("entry", "normalised"), [
    ("Example.COM", "example.com"), ("example.com.", "example.com"),
    (" .corp.example ", ".corp.example"), ("*.Apps.example", "*.apps.example"),
    ("*", "*"), ("::1", "[::1]"), ("[::1]", "[::1]"), ("10.0.0.5", "10.0.0.5"),
])
def test_an_entry_is_normalised(entry: str, normalised: str) -> None:
    assert parse_pattern(entry) == normalised


@pytest.mark.parametrize("entry", ["http://example.com", "example.com:80", "[::1]:80",
                                   "a@b", "*.", ".", "**", "*.*", "*.[::1]", "", "a b"])
def test_a_bad_entry_says_what_it_must_be(entry: str) -> None:
    with pytest.raises(ValueError, match="must"):
        parse_pattern(entry)


def test_matching() -> None:
    hosts = AllowedHosts.of(["localhost", ".corp.example", "*.apps.example"])
    assert all(hosts.allows(h) for h in ("localhost", "corp.example", "a.corp.example",
                                         "a.b.corp.example", "x.apps.example"))
    assert not any(hosts.allows(h) for h in ("localhost.evil", "evilcorp.example",
                                             "apps.example", "corp.example.evil", "evil"))
    assert AllowedHosts.of(["*"]).allows("anything.example")


def test_a_wildcard_bind_names_no_host() -> None:
    assert [bind_pattern(a) for a in ("0.0.0.0", "::", "[::]", "")] == [None] * 4
    assert bind_pattern("127.0.0.2") == "127.0.0.2" and bind_pattern("::1") == "[::1]"
    assert bind_pattern("Box.LAN") == "box.lan"


def test_the_setting_is_checked_when_the_config_is_built() -> None:
    assert Config(web_allowed_hosts=["dash.example.com"]).web_allowed_hosts
    with pytest.raises(ConfigError, match=r"web_allowed_hosts must .*'dash:80' is not"):
        Config.from_mapping({"web_allowed_hosts": ["ok.example", "dash:80"]}, source="t.toml")


def test_mounted_without_a_list_the_host_app_decides(config: Config, r: redis.Redis) -> None:
    seed(config)
    client = TestClient(wurk.web.app(config), base_url="http://anything.example")
    assert client.get("/queues").status_code == 200
    # The Origin rule of a POST stands without a list: it must be the request's Host.
    assert client.post("/queues/default/pause", data={"csrf": "x" * 43},
                       headers={"origin": "http://evil.example"}).status_code == 403


def test_mounted_with_a_list_it_refuses_other_hosts(config: Config, r: redis.Redis) -> None:
    seed(config)
    app = wurk.web.app(config, allowed_hosts=["dash.example.com"])
    assert TestClient(app, base_url="http://testserver").get("/queues").status_code == 400
    for base in ("http://dash.example.com", "http://localhost:8000", "http://[::1]"):
        assert TestClient(app, base_url=base).get("/queues").status_code == 200, base
    configured = wurk.web.app(Config(redis_url=config.redis_url,
                                     web_allowed_hosts=["dash.example.com"]))
    assert TestClient(configured, base_url="http://evil.example").get("/").status_code == 400
    assert TestClient(configured, base_url="http://dash.example.com").get("/").status_code == 200


def test_app_refuses_a_bad_list() -> None:
    with pytest.raises(TypeError):
        wurk.web.app(allowed_hosts="dash.example.com")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allowed host 'http://x' must be"):
        wurk.web.app(allowed_hosts=["http://x"])


def _call(app: Any, headers: list[tuple[bytes, bytes]], **scope: Any) -> tuple[int, bytes]:
    """One request straight into the ASGI app, headers exactly as given."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "GET", "path": "/stats.json", "raw_path":
                     b"/stats.json", "query_string": b"", "root_path": "", "headers": headers,
                     "scheme": "http", "server": ("127.0.0.1", 7433), "client": ("1.2.3.4", 5),
                     "http_version": "1.1", **scope}, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_scopes_no_h11_would_pass_are_refused(config: Config) -> None:
    app = wurk.web.app(config, allowed_hosts=[])
    assert _call(app, [(b"host", b"127.0.0.1:7433")])[0] == 200
    for pair in ((b"127.0.0.1", b"evil.example"), (b"evil.example", b"127.0.0.1")):
        status, body = _call(app, [(b"host", pair[0]), (b"host", pair[1])])
        assert status == 400 and b"several Host headers" in body
    # An absolute-form target, whose authority HTTP says overrides Host.
    status, _ = _call(app, [(b"host", b"127.0.0.1")], raw_path=b"http://evil.example/stats.json")
    assert status == 400
    status, _ = _call(app, [(b"Host", b"EVIL.example")])
    assert status == 400
    # No Host at all: the address the connection reached stands for it.
    assert _call(app, [])[0] == 200
    assert _call(app, [], server=("10.9.9.9", 7433))[0] == 400
    assert _call(app, [], server=None)[0] == 400

"""The Profiles pages over HTTP: real cProfile runs, Ruby's Vernier type, hostile data."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

import wurk.web
from wurk.observe import profiler
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config


def web_profiled_marker(n: int) -> int:
    return sum(i * i for i in range(n))


@pytest.fixture
def web(config: Config) -> Iterator[TestClient]:
    with TestClient(wurk.web.app(config)) as client:
        yield client


def test_list_show_sort_and_download_a_profile(config: Config, web: TestClient) -> None:
    profiler.profiled(runtime_for(config), {"class": "Report", "jid": "j1", "profile": "<alice>"},
                      lambda: web_profiled_marker(20_000))
    listing = web.get("/profiles").text
    assert "&lt;alice&gt;" in listing and "<alice>" not in listing and "cprofile" in listing
    shown = web.get("/profiles/<alice>-j1").text
    assert "web_profiled_marker" in shown and "heaviest functions" in shown
    by_calls = web.get("/profiles/<alice>-j1", params={"sort": "calls"}).text
    assert 'aria-current="page">Calls' in by_calls
    assert web.get("/profiles/<alice>-j1", params={"sort": "bogus"}).status_code == 200
    data = web.get("/profiles/<alice>-j1/download")
    assert data.headers["content-disposition"].startswith('attachment; filename="')
    assert ".prof" in data.headers["content-disposition"] and "<" not in \
        data.headers["content-disposition"]
    assert len(data.content) > 100
    assert web.get("/profiles/nope-1").status_code == 404
    assert web.get("/profiles/nope-1/download").status_code == 404


def test_a_ruby_profile_is_offered_for_download(web: TestClient, r: redis.Redis) -> None:
    r.zadd("profiles", {"ruby-j1": time.time() + 60})
    r.hset("ruby-j1", mapping={"token": "ruby", "type": "HardJob", "jid": "j1",
                               "data": gzip.compress(b'{"meta": 1}')})
    assert "download it" in web.get("/profiles/ruby-j1").text
    got = web.get("/profiles/ruby-j1/download")
    assert got.content == b'{"meta": 1}' and '.json"' in got.headers["content-disposition"]


def test_crafted_profile_data_is_refused_not_unmarshalled(
        config: Config, web: TestClient, r: redis.Redis) -> None:
    profiler.profiled(runtime_for(config), {"class": "Evil", "jid": "e1", "profile": "ev"},
                      lambda: web_profiled_marker(100))
    r.hset("ev-e1", "data", gzip.compress(b"\xff\x00not marshal at all"))
    page = web.get("/profiles/ev-e1")
    assert page.status_code == 200 and "cannot read profile" in page.text

"""The dashboard mounted in host apps (the docs' examples) and served by ``wurk web``."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
import redis
from starlette.testclient import TestClient
from webpages import seed

from examples.web import asgi_dispatch, flask_host, starlette_host
from wurk.settings.config import Config

ROOT = Path(__file__).resolve().parent.parent
WURK = str(Path(sys.executable).with_name("wurk"))


def test_starlette_host_serves_it_under_its_prefix(config: Config, r: redis.Redis) -> None:
    seed(config)
    with TestClient(starlette_host.make_app(config), base_url="http://www.example.com") as client:
        assert client.get("/").text == "my app"
        page = client.get("/admin/wurk/queues")
        assert page.status_code == 200
        assert 'href="/admin/wurk/queues/default"' in page.text
        assert 'href="/admin/wurk/static/app.css"' in page.text
        assert client.get("/admin/wurk/static/app.js").status_code == 200
        assert "Path=/admin/wurk/" in page.headers["set-cookie"]
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        done = client.post("/admin/wurk/queues/default/pause", data={"csrf": csrf})
        assert done.url.path == "/admin/wurk/queues"
    assert r.sismember("paused", "default")


def test_starlette_host_checks_the_host_of_the_mounted_dashboard(config: Config,
                                                                 r: redis.Redis) -> None:
    seed(config)
    # Starlette's TrustedHostMiddleware around the host app covers the mount.
    with TestClient(starlette_host.make_app(config), base_url="http://evil.example") as client:
        page = client.get("/admin/wurk/queues/default")
        assert page.status_code == 400 and "photo" not in page.text


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flask_server(config: Config) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, flask_host.make_app(config), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_flask_host_serves_it_through_wsgi(config: Config, flask_server: str,
                                           r: redis.Redis) -> None:
    seed(config)
    with urllib.request.urlopen(f"{flask_server}/") as reply:
        assert reply.read() == b"my app"
    with urllib.request.urlopen(f"{flask_server}/admin/wurk/dead") as reply:
        html = reply.read().decode()
        cookie = reply.headers["set-cookie"].split(";")[0]
    assert "ChargeCard" in html and 'href="/admin/wurk/busy"' in html
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    request = urllib.request.Request(
        f"{flask_server}/admin/wurk/queues/critical/pause", method="POST",
        data=f"csrf={csrf}".encode(),
        headers={"cookie": cookie, "content-type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(request) as reply:
        assert reply.status == 200 and "/admin/wurk/queues?" in reply.url
    assert r.sismember("paused", "critical")
    port = int(flask_server.rsplit(":", 1)[1])
    for host, status in (("evil.example", 400), ("www.example.com", 200)):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        connection.request("GET", "/admin/wurk/dead", headers={"Host": host})
        reply = connection.getresponse()
        assert reply.status == status, host
        assert ("ChargeCard" in reply.read().decode()) == (status == 200)
        connection.close()


def test_wurk_web_serves_on_a_free_port_and_stops_on_term(redis_server: object,
                                                          r: redis.Redis) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    with subprocess.Popen([WURK, "web", "--port", "0", "--redis-url", url, "--read-only"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            found = re.search(r"serving (http://127\.0\.0\.1:\d+/) \(read-only\)", line)
            assert found, line
            with urllib.request.urlopen(found.group(1) + "queues") as reply:
                assert reply.status == 200 and b"Queues" in reply.read()
        finally:
            proc.terminate()
            assert proc.wait(10) == 0


def test_wurk_web_refuses_a_bad_port() -> None:
    done = subprocess.run([WURK, "web", "--port", "70000"], capture_output=True, text=True,
                          timeout=30, check=False)
    # A usage error, refused where the option is parsed (status 2, argparse's).
    assert done.returncode == 2 and "from 0 to 65535" in done.stderr


def test_import_wurk_and_wurk_help_never_load_the_dashboard() -> None:
    code = ("import sys, wurk, wurk.cli, wurk.api; wurk.cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('starlette', 'jinja2', 'uvicorn', 'a2wsgi') or m.startswith('wurk.web')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=30, check=True)
    assert done.stdout.strip() == "[]"


def test_a_prefix_dispatcher_in_front_of_any_asgi_app(config: Config, r: redis.Redis) -> None:
    seed(config)
    # No `with`: Django's handler, like the stand-in, speaks no lifespan protocol.
    client = TestClient(asgi_dispatch.make_app(config), base_url="http://www.example.com")
    assert client.get("/").text == "host app"
    assert client.get("/admin/wurkish").text == "host app"
    page = client.get("/admin/wurk/retries")
    assert page.status_code == 200 and "SyncAccount" in page.text
    assert 'href="/admin/wurk/dead"' in page.text
    # The dispatcher sends the dashboard's requests past Django's ALLOWED_HOSTS:
    # the dashboard checks the list it was given itself.
    evil = TestClient(asgi_dispatch.make_app(config), base_url="http://evil.example")
    assert evil.get("/").text == "host app"
    refused = evil.get("/admin/wurk/retries")
    assert refused.status_code == 400 and "evil.example" in refused.text
    assert "SyncAccount" not in refused.text

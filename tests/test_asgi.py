"""wurk.contrib.asgi with FastAPI and Starlette: workers for the app's lifespan,
pushes from sync and async handlers (examples/fastapi_app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, free_port
from swarms import REPO
from waiting import wait_for

pytest.importorskip("fastapi")

from fastapi import FastAPI
from fastapi.testclient import TestClient

import wurk
from examples import fastapi_app
from examples.jobs import CHARGES, WELCOMED
from wurk.contrib.asgi import Workers, lifespan, with_workers
from wurk.settings.config import Config


def test_the_lifespan_closes_the_loops_default_async_client(config: Config,
                                                            r: redis.Redis) -> None:
    from examples.jobs import send_welcome_email
    from wurk.push import aclient

    async def serve() -> tuple[Any, Any]:
        async with Workers(embedded=True, config=config).lifespan():
            used = wurk.AsyncClient.default()
            await send_welcome_email.set(client=used).aperform_async(5, "e@example.com")
        # Closed with the app: a later push on this loop gets a client of its own.
        return used, aclient._defaults.get(asyncio.get_running_loop())

    previous = wurk.default_config()
    wurk.configure(config)
    try:
        used, left = asyncio.run(serve())
    finally:
        wurk.configure(previous)
    assert left is None and used is not None
    # The push itself landed (the worker may have stopped before it ran it).
    assert r.llen("queue:default") == 1 or r.sismember(WELCOMED, "5")


def test_an_embedded_worker_runs_jobs_pushed_from_async_and_sync_handlers(
        config: Config, r: redis.Redis) -> None:
    both = dataclasses.replace(config, queues=["critical", "default"])
    app = FastAPI(lifespan=lifespan(embedded=True, config=both))
    app.include_router(fastapi_app.app.router)
    with TestClient(app) as client:
        jid = client.post("/signup/3").json()["enqueued"]
        charged = client.post("/orders/o-9/charge").json()["enqueued"]
        assert isinstance(jid, str) and isinstance(charged, str)
        wait_for(lambda: r.sismember(WELCOMED, "3") and r.hexists(CHARGES, "o-9"),
                 what="both jobs ran in the app's process")
        processes = r.smembers("processes")
        assert len(processes) == 1
        [identity] = processes
        assert json.loads(r.hget(identity, "info"))["embedded"] is True
    # The lifespan's end drained the worker: it is gone from Redis.
    assert r.smembers("processes") == set()


def test_workers_take_a_topology_or_embedded_not_both() -> None:
    with pytest.raises(ValueError, match="either a topology"):
        Workers()
    with pytest.raises(ValueError, match="either a topology"):
        Workers("t.toml", embedded=True)
    with pytest.raises(ValueError, match="config is for embedded"):
        Workers("t.toml", config=Config())


def test_a_bare_app_whose_workers_cannot_start_fails_its_startup(tmp_path: Path) -> None:
    served: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope["type"])

    wrapped = with_workers(app, tmp_path / "missing.toml")
    sent: list[dict[str, Any]] = []

    async def drive() -> None:
        messages = [{"type": "lifespan.startup"}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await wrapped({"type": "lifespan"}, receive, send)
        await wrapped({"type": "http"}, receive, send)

    asyncio.run(drive())
    assert sent[0]["type"] == "lifespan.startup.failed"
    assert "cannot read the topology file" in sent[0]["message"]
    assert served == ["http"]


@pytest.fixture
def uvicorn_app(tmp_path: Path, redis_server: RedisServer,
                r: redis.Redis) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    pytest.importorskip("uvicorn")
    topology = tmp_path / "topology.toml"
    topology.write_text(
        f'[wurk]\nredis_url = "{redis_server.url}"\nheartbeat_interval = 0.5\n'
        'fetch_timeout = 0.5\nshutdown_timeout = 3\nlog_format = "json"\n\n'
        '[[slot]]\nname = "web"\ncount = 2\nconcurrency = 2\nqueues = ["critical", "default"]\n')
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update({"WURK_TOPOLOGY": str(topology), "REDIS_URL": redis_server.url,
                "PYTHONPATH": str(REPO)})
    log = tmp_path / "uvicorn.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port),
             "--host", "127.0.0.1"], cwd=REPO, env=env, stdout=out, stderr=out,
            stdin=subprocess.DEVNULL, start_new_session=True)
    yield proc, f"http://127.0.0.1:{port}", log
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_uvicorn_hosts_a_swarm_for_the_apps_lifespan(
        uvicorn_app: tuple[subprocess.Popen[bytes], str, Path], r: redis.Redis) -> None:
    proc, url, log = uvicorn_app

    def children() -> set[str]:
        infos = [r.hget(i, "info") for i in r.smembers("processes")]
        return {i for i in infos if i and json.loads(i).get("swarm_pid") == proc.pid}

    wait_for(lambda: len(children()) == 2, timeout=30, what="two hosted children beating")
    request = urllib.request.Request(f"{url}/signup/21", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200, log.read_text()[-2000:]
        assert len(json.loads(reply.read())["enqueued"]) == 24
    wait_for(lambda: r.sismember(WELCOMED, "21"), what="a child ran the welcome job")
    proc.send_signal(signal.SIGTERM)
    # uvicorn ends by raising the signal it was stopped with again.
    assert proc.wait(30) in (0, -signal.SIGTERM), log.read_text()[-2000:]
    assert "Application shutdown complete" in log.read_text()
    # The app's shutdown drained the swarm: no child is left beating.
    assert r.smembers("processes") == set()

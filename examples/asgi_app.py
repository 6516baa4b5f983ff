"""A plain ASGI app (run it with ``uvicorn examples.asgi_app:app``) that runs
wurk next to the web server, in one of two modes chosen by ``WURK_MODE``:

- ``swarm`` (default): a supervised swarm of forked workers from
  ``WURK_TOPOLOGY`` (default ``examples/topology.toml``); the web server
  keeps its signals, the swarm drains when the app shuts down.
- ``embedded``: worker threads inside this process; no fork.

Enqueueing from a request is the same in both: ``perform_async``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from examples import jobs
from supervisor.hosting import HostedSwarm
from wurk.runtime.embedded import Embedded

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

runner: HostedSwarm | Embedded | None = None


def start_workers() -> HostedSwarm | Embedded:
    if os.environ.get("WURK_MODE", "swarm") == "embedded":
        return Embedded().start()
    return HostedSwarm(os.environ.get("WURK_TOPOLOGY", "examples/topology.toml")).start()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    global runner  # noqa: PLW0603 - one worker runner per web process
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                runner = start_workers()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if runner is not None:
                    runner.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        jid = jobs.send_welcome_email.perform_async(1, "someone@example.com")
        body = json.dumps({"enqueued": jid}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

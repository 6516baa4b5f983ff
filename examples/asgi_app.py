"""A plain ASGI app (run it with ``uvicorn examples.asgi_app:app``) that runs
wurk next to the web server, in one of two modes chosen by ``WURK_MODE``:

- ``swarm`` (default): a supervised swarm of forked workers from
  ``WURK_TOPOLOGY`` (default ``examples/topology.toml``); the web server
  keeps its signals, the swarm drains when the app shuts down.
- ``embedded``: worker threads inside this process; no fork.

``wurk.contrib.asgi.with_workers`` answers the lifespan messages; the app
itself only serves requests. A request enqueues with ``aperform_async``,
which pushes through the event loop's ``wurk.AsyncClient`` (the lifespan
closes it at shutdown).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from examples import jobs
from wurk.contrib.asgi import Workers

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

if os.environ.get("WURK_MODE", "swarm") == "embedded":
    workers = Workers(embedded=True)
else:
    workers = Workers(os.environ.get("WURK_TOPOLOGY", "examples/topology.toml"))


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        jid = await jobs.send_welcome_email.aperform_async(1, "someone@example.com")
        body = json.dumps({"enqueued": jid}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


app = workers.wrap(serve)

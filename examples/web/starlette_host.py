"""Mount the wurk dashboard inside a Starlette (or FastAPI) application.

    uvicorn examples.web.starlette_host:app

The dashboard lives under /admin/wurk; its links follow the mount prefix.
Put it behind your own authentication with a middleware on the mount (see
docs/how-to/dashboard.md); this example keeps it read-write and open.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import wurk.web


async def home(request: Request) -> PlainTextResponse:
    return PlainTextResponse("my app")


def make_app(config: wurk.Config | None = None) -> Starlette:
    return Starlette(routes=[
        Route("/", home),
        Mount("/admin/wurk", app=wurk.web.app(config)),
    ])


app = make_app()

"""Mount the wurk dashboard inside a Starlette (or FastAPI) application.

    uvicorn examples.web.starlette_host:app

The dashboard lives under /admin/wurk; its links follow the mount prefix.
Put it behind your own authentication with a middleware on the mount (see
docs/how-to/dashboard.md); this example keeps it read-write and open.
Starlette's TrustedHostMiddleware around the whole app refuses any Host it
does not list, the dashboard's requests included: mounted, the dashboard
leaves that check to its host application.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import wurk.web

ALLOWED_HOSTS = ["localhost", "127.0.0.1", "www.example.com"]


async def home(request: Request) -> PlainTextResponse:
    return PlainTextResponse("my app")


def make_app(config: wurk.Config | None = None) -> Starlette:
    return Starlette(routes=[
        Route("/", home),
        Mount("/admin/wurk", app=wurk.web.app(config)),
    ], middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=ALLOWED_HOSTS)])


app = make_app()

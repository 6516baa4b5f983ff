"""Route one path prefix to the wurk dashboard in front of any ASGI app.

The shape for Django's ASGI (``django_app = get_asgi_application()``) or any
framework without a ``mount``: requests under ``/admin/wurk`` go to the
dashboard with ``root_path`` extended, so its links carry the prefix;
everything else goes to the host app. ``host_app`` below stands in for
Django here, so the tests can run this file as it is.

Django answers only its ``ALLOWED_HOSTS``, but the dashboard's requests
never reach Django: the dashboard gets the same list, and refuses (400)
every other Host itself.
"""

from __future__ import annotations

from typing import Any

import wurk.web

PREFIX = "/admin/wurk"
ALLOWED_HOSTS = ["www.example.com"]  # under Django: settings.ALLOWED_HOSTS


async def host_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Stands in for ``django.core.asgi.get_asgi_application()``."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"host app"})


def make_app(config: wurk.Config | None = None, fallback: Any = host_app) -> Any:
    dashboard = wurk.web.app(config, allowed_hosts=ALLOWED_HOSTS)

    async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == PREFIX or path.startswith(PREFIX + "/")):
            scope = {**scope, "root_path": scope.get("root_path", "") + PREFIX}
            await dashboard(scope, receive, send)
        else:
            await fallback(scope, receive, send)

    return application


application = make_app()

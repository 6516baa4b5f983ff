"""The dashboard's Starlette application: routes, static files, errors.

Duties:
1. :func:`build`: one Starlette app with every page's routes (the
   ``views_*`` modules), the shipped static files, and
   :class:`wurk.web.security.Guard` around it all.
2. Errors as pages: 403/404/405/413 from HTTPException, and a 503 that names
   the Redis (password masked) when Redis cannot be reached.
"""

from __future__ import annotations

from importlib import resources

import jinja2
import redis.exceptions as rx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from wurk.api.common import resolve
from wurk.core.redaction import redact_text, redact_url
from wurk.settings.config import Config
from wurk.web import (
    present,
    views_busy,
    views_dashboard,
    views_locks,
    views_metrics,
    views_periodic,
    views_profiles,
    views_queues,
    views_sets,
    views_spool,
    views_swarms,
)
from wurk.web.security import Guard
from wurk.web.site import Site, site_of


def routes() -> list[BaseRoute]:
    static = StaticFiles(directory=str(resources.files("wurk.web") / "static"))
    return [*views_dashboard.ROUTES, *views_queues.ROUTES, *views_sets.ROUTES,
            *views_busy.ROUTES, *views_swarms.ROUTES, *views_profiles.ROUTES,
            *views_metrics.ROUTES, *views_periodic.ROUTES, *views_locks.ROUTES,
            *views_spool.ROUTES,
            Mount("/static", app=static, name="static")]

async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return site_of(request).render(request, "error.html", status=exc.status_code,
                                   title=f"{exc.status_code}", message=exc.detail)

async def _redis_error(request: Request, exc: Exception) -> Response:
    site = site_of(request)
    message = redact_text(f"Redis at {redact_url(site.config.redis_url)}: "
                          f"{type(exc).__name__}: {exc}")
    return site.render(request, "error.html", status=503, title="Redis unavailable",
                       message=message)

def build(config: Config | None, *, read_only: bool, username: str | None,
          password: str | None, poll_interval: float) -> Guard:
    cfg = resolve(config)
    if not 1 <= poll_interval <= 3600:
        raise ValueError(f"poll_interval must be between 1 and 3600 seconds, got {poll_interval}")
    env = present.environment(jinja2.PackageLoader("wurk.web", "templates"))
    app = Starlette(routes=routes(), exception_handlers={
        HTTPException: _http_error, rx.RedisError: _redis_error})
    app.state.site = Site(cfg, read_only, env, poll_interval)
    user = username if username is not None else cfg.web_user
    secret = password if password is not None else cfg.web_password
    return Guard(app, username=user, password=secret)

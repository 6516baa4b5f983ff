"""The dashboard's Starlette application: routes, static files, errors.

Duties:
1. :func:`build`: one Starlette app with every page's routes (the
   ``views_*`` modules), the shipped static files, and
   :class:`wurk.web.security.Guard` around it all, checking Host against
   the allowed hosts (:func:`allowed_hosts`) when any are given.
2. Errors as pages: 403/404/405/413 from HTTPException, and a 503 that names
   the Redis (password masked) when Redis cannot be reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

import jinja2
import redis.exceptions as rx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from wurk.core.redaction import redact_text, redact_url
from wurk.settings.config import Config
from wurk.settings.hosts import LOOPBACK_HOSTS, AllowedHosts
from wurk.web import (
    present,
    views_batches,
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
from wurk.wire.replies import resolve


def routes() -> list[BaseRoute]:
    static = StaticFiles(directory=str(resources.files("wurk.web") / "static"))
    return [*views_dashboard.ROUTES, *views_queues.ROUTES, *views_sets.ROUTES,
            *views_busy.ROUTES, *views_swarms.ROUTES, *views_profiles.ROUTES,
            *views_metrics.ROUTES, *views_periodic.ROUTES, *views_locks.ROUTES,
            *views_spool.ROUTES, *views_batches.ROUTES,
            Route("/favicon.ico", _favicon),  # asked for by browsers whatever the page says
            Mount("/static", app=static, name="static")]


async def _favicon(request: Request) -> Response:
    icon = (resources.files("wurk.web") / "static" / "favicon.svg").read_bytes()
    return Response(icon, media_type="image/svg+xml")

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

def allowed_hosts(given: Sequence[str] | None, config: Config) -> AllowedHosts | None:
    """The loopback names plus ``given``, else plus the config's list; None when neither
    names any, so a host application's checks apply (every `wurk web` gives a list)."""
    if isinstance(given, str):
        raise TypeError("allowed_hosts must be a list of hosts, not one string")
    entries = list(given) if given is not None else config.web_allowed_hosts
    if given is None and not entries:
        return None
    return AllowedHosts.of([*LOOPBACK_HOSTS, *entries])

def build(config: Config | None, *, read_only: bool, username: str | None,
          password: str | None, poll_interval: float,
          hosts: Sequence[str] | None = None) -> Guard:
    cfg = resolve(config)
    checked_hosts = allowed_hosts(hosts, cfg)
    if not 1 <= poll_interval <= 3600:
        raise ValueError(f"poll_interval must be between 1 and 3600 seconds, got {poll_interval}")
    env = present.environment(jinja2.PackageLoader("wurk.web", "templates"))
    app = Starlette(routes=routes(), exception_handlers={
        HTTPException: _http_error, rx.RedisError: _redis_error})
    app.state.site = Site(cfg, read_only, env, poll_interval)
    user = username if username is not None else cfg.web_user
    secret = password if password is not None else cfg.web_password
    return Guard(app, username=user, password=secret, hosts=checked_hosts)

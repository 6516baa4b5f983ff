"""The dashboard's Starlette application: routes, rendering, errors.

Duties:
1. :func:`build`: one Starlette app with every page's routes, the shipped
   static files, and :class:`wurk.web.security.Guard` around it all.
2. :class:`Site`: what every view needs: the config, read-only mode, the
   Jinja2 environment, and :meth:`Site.render`, which gives each template
   the mount prefix (``base``), the CSRF token and the navigation.
3. :func:`page` and :func:`action`: wrap a view so its blocking Redis calls
   run in a worker thread; ``action`` first passes the POST through
   :func:`wurk.web.security.checked_form`, so no POST skips the CSRF check.
4. Errors as pages: 403/404/405/413 from HTTPException, and a 503 that names
   the Redis (password masked) when Redis cannot be reached.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
import redis.exceptions as rx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from wurk.api.common import resolve
from wurk.core.redaction import redact_text, redact_url
from wurk.settings.config import Config
from wurk.version import __version__
from wurk.web import present
from wurk.web.security import Guard, checked_form, csrf_token

NAV = (("dashboard", "Dashboard", "/"), ("busy", "Busy", "/busy"),
       ("queues", "Queues", "/queues"), ("retries", "Retries", "/retries"),
       ("scheduled", "Scheduled", "/scheduled"), ("dead", "Dead", "/dead"))

View = Callable[..., Response]

@dataclass
class Site:
    config: Config
    read_only: bool
    env: jinja2.Environment
    poll_interval: float

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        context.setdefault("active", "")
        html = self.env.get_template(template).render(
            base=base_path(request), csrf=csrf_token(request), read_only=self.read_only,
            nav=NAV, version=__version__, request_path=request.url.path,
            redis_url=redact_url(self.config.redis_url), poll_interval=self.poll_interval,
            **context)
        return HTMLResponse(html, status_code=status)

def base_path(request: Request) -> str:
    return str(request.scope.get("root_path") or "").rstrip("/")

def site_of(request: Request) -> Site:
    site: Site = request.app.state.site
    return site

def redirect(request: Request, path: str, **query: Any) -> RedirectResponse:
    """303 to ``path`` under the mount prefix (POST, then GET: no resubmits)."""
    suffix = f"?{urlencode(query)}" if query else ""
    return RedirectResponse(f"{base_path(request)}{path}{suffix}", status_code=303)

def page(view: View) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(view)
    async def endpoint(request: Request) -> Response:
        return await run_in_threadpool(view, request, site_of(request))
    return endpoint

def action(view: Callable[[Request, Site, FormData], Response]
           ) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(view)
    async def endpoint(request: Request) -> Response:
        site = site_of(request)
        form = await checked_form(request, read_only=site.read_only)
        return await run_in_threadpool(view, request, site, form)
    return endpoint

def routes() -> list[BaseRoute]:
    # The views import this module for Site, page and action.
    from wurk.web import (  # noqa: PLC0415
        views_busy,
        views_dashboard,
        views_queues,
        views_sets,
    )

    static = StaticFiles(directory=str(resources.files("wurk.web") / "static"))
    return [*views_dashboard.ROUTES, *views_queues.ROUTES, *views_sets.ROUTES,
            *views_busy.ROUTES, Mount("/static", app=static, name="static")]

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

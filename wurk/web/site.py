"""What every dashboard view shares: the site, rendering, and the view wrappers.

Duties:
1. :class:`Site`: the config, read-only mode, the Jinja2 environment, and
   :meth:`Site.render`, which gives each template the mount prefix
   (``base``), the CSRF token, the navigation and the masked Redis URL.
2. :func:`page` and :func:`action`: wrap a view so its blocking Redis calls
   run in a worker thread; ``action`` first passes the POST through
   :func:`wurk.web.security.checked_form`, so no POST skips the CSRF check.
3. :func:`redirect`: POST, then a 303 to a GET under the mount prefix.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from wurk.core.redaction import redact_url
from wurk.redis.runtime import Runtime, runtime_for
from wurk.settings.config import Config
from wurk.version import __version__
from wurk.web.security import checked_form, csrf_token

NAV = (("dashboard", "Dashboard", "/"), ("busy", "Busy", "/busy"),
       ("swarms", "Swarms", "/swarms"), ("queues", "Queues", "/queues"),
       ("retries", "Retries", "/retries"), ("scheduled", "Scheduled", "/scheduled"),
       ("dead", "Dead", "/dead"), ("batches", "Batches", "/batches"),
       ("workflows", "Workflows", "/workflows"), ("metrics", "Metrics", "/metrics"),
       ("periodic", "Periodic", "/periodic"), ("limiters", "Limiters", "/limiters"),
       ("unique", "Unique", "/unique"), ("spool", "Spool", "/spool"),
       ("profiles", "Profiles", "/profiles"))

View = Callable[..., Response]

@dataclass
class Site:
    config: Config
    read_only: bool
    env: jinja2.Environment
    poll_interval: float
    # The dashboard's pools, found once for its config.
    runtime: Runtime = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = runtime_for(self.config)

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

"""The web dashboard: see and steer queues, retries, the morgue and processes.

``wurk web`` serves it; :func:`app` returns it as an ASGI application to
mount in Starlette, FastAPI or Django's ASGI, :func:`wsgi_app` as a WSGI
one for Flask or Django. It needs the ``wurk[web]`` extra (Starlette,
Jinja2, uvicorn, a2wsgi); ``import wurk`` never imports this package.

Duties:
1. :func:`app` / :func:`wsgi_app`: the public entry points, which check the
   extra is installed and name it when it is not (:class:`MissingExtraError`).
2. Modules: ``application`` (routes and errors), ``site`` (rendering and
   the view wrappers), ``security`` (basic auth, CSRF, read-only, headers),
   ``hosts`` (the Host and Origin checks), ``present`` (how jobs, times and
   numbers are shown), ``views_*`` (one module per page group), ``server`` (the
   ``wurk web`` command), ``templates/`` and ``static/`` (shipped in the wheel).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from wurk.settings.config import Config

EXTRA_MODULES = ("starlette", "jinja2")


class MissingExtraError(ImportError):
    """The ``wurk[web]`` extra is not installed."""


def require_extra(*modules: str) -> None:
    """Raise :class:`MissingExtraError` naming the extra when a module is missing."""
    missing = [name for name in modules or EXTRA_MODULES
               if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(
            f"the web dashboard needs {', '.join(missing)}: install the extra with "
            "pip install 'wurk[web]'")


def app(config: Config | None = None, *, read_only: bool = False,
        username: str | None = None, password: str | None = None,
        poll_interval: float = 5.0, allowed_hosts: Sequence[str] | None = None) -> Any:
    """The dashboard as an ASGI application.

    ``config`` picks the Redis (default: ``wurk.default_config()``);
    ``read_only`` hides every button and refuses every POST; ``username`` and
    ``password`` (default: the config's ``web_user``/``web_password``) turn
    on HTTP basic auth. ``allowed_hosts`` (default: the config's
    ``web_allowed_hosts``) are the Host names it answers besides the
    loopback names, any other refused with 400; when neither names any, it
    checks no Host, and the host application's own checks must. Mounted
    under a prefix, its links follow the ``root_path`` the host gives it.
    """
    require_extra()
    from wurk.web.application import build  # noqa: PLC0415 - after the extra check

    return build(config, read_only=read_only, username=username, password=password,
                 poll_interval=poll_interval, hosts=allowed_hosts)


def wsgi_app(config: Config | None = None, *, read_only: bool = False,
             username: str | None = None, password: str | None = None,
             poll_interval: float = 5.0, allowed_hosts: Sequence[str] | None = None) -> Any:
    """The dashboard as a WSGI application (through a2wsgi), same options as :func:`app`."""
    require_extra("starlette", "jinja2", "a2wsgi")
    from a2wsgi import ASGIMiddleware  # noqa: PLC0415 - after the extra check

    return ASGIMiddleware(app(config, read_only=read_only, username=username,
                              password=password, poll_interval=poll_interval,
                              allowed_hosts=allowed_hosts))


__all__ = ["MissingExtraError", "app", "require_extra", "wsgi_app"]

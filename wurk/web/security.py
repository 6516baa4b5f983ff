"""What guards the dashboard: allowed hosts, basic auth, CSRF, read-only mode, headers.

Duties:
1. :class:`Guard`, an ASGI middleware around the whole app: with an allow
   list, a request whose Host (or Origin) is not allowed is refused before
   anything else, 400 (403 for the Origin) with a ``web.host_refused`` (or
   ``web.origin_refused``) warning (:mod:`wurk.web.hosts`); HTTP basic auth
   when a user and password are set (constant-time compare, 401 with a
   challenge otherwise); only GET, HEAD and POST pass (405); security
   headers on every response (CSP ``default-src 'self'``, no framing,
   nosniff, no referrer leaks); a CSRF token per browser in a cookie, made
   on the first visit and handed to the pages through ``scope["state"]``.
2. :func:`checked_form`: every POST handler's first step. It refuses the
   POST in read-only mode, from another origin (an Origin header that is
   not the request's Host, or not an allowed host), or without the form field
   ``csrf`` equal to the cookie (a double-submit token: a page on another
   site can neither read the cookie nor set it, and it is SameSite=Strict);
   each refusal is a 403. It then parses the urlencoded body (at most
   :data:`MAX_BODY` bytes) into a multi-dict.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

from wurk.core.logging import get_logger
from wurk.settings.hosts import AllowedHosts
from wurk.web.hosts import origin_allowed, refusal, shown

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CSRF_COOKIE = "wurk_csrf"
CSRF_FIELD = "csrf"
MAX_BODY = 4 * 1024 * 1024  # a job's raw payload travels in the delete-one-job form
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{32,64}$")
ALLOWED_METHODS = ("GET", "HEAD", "POST")
HOSTS_STATE = "allowed_hosts"

log = get_logger("wurk.web")

SECURITY_HEADERS = (
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
     b"form-action 'self'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


class Guard:
    """Host check, auth, method filter, headers and the CSRF cookie around ``app``.

    ``hosts`` None turns the host check off (a host application's own
    applies); the Origin of a POST must then still equal its Host."""

    def __init__(self, app: ASGIApp, *, username: str | None, password: str | None,
                 hosts: AllowedHosts | None = None) -> None:
        self.app = app
        self.hosts = hosts
        if (username is None) != (password is None) or password == "":
            raise ValueError("basic auth needs both a user name and a non-empty password")
        self.credentials = (f"{username}:{password}".encode() if username is not None
                            else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.hosts is not None and not await self._host_passes(scope, self.hosts, send):
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.credentials is not None and not self._authorized(headers):
            await _plain(send, 401, b"authentication required",
                         [(b"www-authenticate", b'Basic realm="wurk", charset="UTF-8"')])
            return
        if scope["method"] not in ALLOWED_METHODS:
            await _plain(send, 405, b"method not allowed", [(b"allow", b"GET, HEAD, POST")])
            return
        token = _cookie(headers.get(b"cookie", b""), CSRF_COOKIE)
        fresh = token is None
        if token is None:
            token = secrets.token_urlsafe(32)
        state = scope.setdefault("state", {})
        state["csrf"], state[HOSTS_STATE] = token, self.hosts

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(SECURITY_HEADERS)
                if fresh:
                    extra.append((b"set-cookie", _set_cookie(scope, token)))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _host_passes(scope: Scope, hosts: AllowedHosts, send: Send) -> bool:
        refused = refusal(scope, hosts)
        if refused is None:
            return True
        if refused.status == 400:
            log.warning("web.host_refused", host=refused.value, reason=refused.reason,
                        method=str(scope.get("method")), path=shown(str(scope.get("path", ""))))
        else:
            log.warning("web.origin_refused", origin=refused.value,
                        method=str(scope.get("method")), path=shown(str(scope.get("path", ""))))
        await _plain(send, refused.status, refused.text.encode(), [])
        return False

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        assert self.credentials is not None
        scheme, _, value = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            given = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, self.credentials)


def _cookie(header: bytes, name: str) -> str | None:
    for part in header.decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and _TOKEN.match(value):
            return value
    return None


def _set_cookie(scope: Scope, token: str) -> bytes:
    path = (scope.get("root_path") or "").rstrip("/") + "/"
    secure = "; Secure" if scope.get("scheme") == "https" else ""
    return f"{CSRF_COOKIE}={token}; Path={path}; HttpOnly; SameSite=Strict{secure}".encode()


async def _plain(send: Send, status: int, body: bytes,
                 headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            *SECURITY_HEADERS, *headers]})
    await send({"type": "http.response.body", "body": body})


def csrf_token(request: Request) -> str:
    token: str = request.scope["state"]["csrf"]
    return token


async def checked_form(request: Request, *, read_only: bool) -> FormData:
    """The POST's form after every check; HTTPException(403) when one fails."""
    if read_only:
        raise HTTPException(403, "the dashboard is read-only")
    if not _same_origin(request):
        raise HTTPException(403, "cross-origin request refused")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise HTTPException(413, "request too large")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=10_000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HTTPException(400, "malformed form") from exc
    form = FormData([(name, value) for name, value in pairs])
    cookie = _cookie(request.headers.get("cookie", "").encode("latin-1"), CSRF_COOKIE)
    given = form.get(CSRF_FIELD)
    if cookie is None or not isinstance(given, str) or not hmac.compare_digest(
            given.encode(), cookie.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form


def _same_origin(request: Request) -> bool:
    """No Origin header (an old browser, a script) passes; the token still has to match.

    One naming another host than the request's, or a host not allowed, fails."""
    origins = request.headers.getlist("origin")
    if not origins:
        return True
    hosts = request.scope.get("state", {}).get(HOSTS_STATE)
    hosts_given = request.headers.getlist("host")
    host = hosts_given[0] if len(hosts_given) == 1 else None
    return len(origins) == 1 and origin_allowed(origins[0], host, hosts)

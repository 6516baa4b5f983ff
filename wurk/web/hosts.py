"""The Host and Origin checks the dashboard's Guard runs on each request.

The rules of what a host is and what matches live in
:mod:`wurk.settings.hosts`; this module applies them to an ASGI scope.

Duties:
1. :func:`refusal`: why a request's Host or Origin is refused, or None. A
   request needs exactly one ``Host`` header naming an allowed host (port
   ignored); with none (HTTP/1.0) the address the connection reached,
   ``scope["server"]``, stands for it, as Django falls back to SERVER_NAME:
   that is an address of this machine, never a name someone else owns.
   An absolute-form request target must name an allowed host too. An
   ``Origin`` header, on any method, must be a single http(s) origin whose
   host is allowed and equals the request's Host.
2. :func:`origin_allowed`: the Origin rule alone, which every POST also
   passes through (:func:`wurk.web.security.checked_form`), with or without
   an allow list.
3. :func:`shown`: a header value cut and escaped for a log line or a reply.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from wurk.settings.hosts import AllowedHosts, host_of

Scope = MutableMapping[str, Any]
_SHOWN = 100


@dataclass(frozen=True)
class Refusal:
    """A refused request: the status, why, the refused value (escaped) and the reply."""

    status: int
    reason: str
    value: str
    text: str


def refusal(scope: Scope, hosts: AllowedHosts) -> Refusal | None:
    """Why ``scope``'s Host or Origin is not allowed by ``hosts``; None when both are."""
    raw = header_values(scope, b"host")
    if len(raw) > 1:
        return _bad_host("several Host headers", " | ".join(raw))
    host_text = raw[0] if raw else server_address(scope)
    if host_text is None:
        return _bad_host("no Host header", "")
    return _host_refusal(host_text, scope, hosts) or _origin_refusal(host_text, scope, hosts)


def _host_refusal(host_text: str, scope: Scope, hosts: AllowedHosts) -> Refusal | None:
    host = host_of(host_text)
    if host is None:
        return _bad_host("malformed Host header", host_text)
    if not hosts.allows(host):
        return _bad_host("host not allowed", host_text)
    authority = _target_authority(scope)
    if authority is not None and not _allowed(authority, hosts):
        return _bad_host("request target names a host not allowed", authority)
    return None


def _origin_refusal(host_text: str, scope: Scope, hosts: AllowedHosts) -> Refusal | None:
    origins = header_values(scope, b"origin")
    if not origins or (len(origins) == 1 and origin_allowed(origins[0], host_text, hosts)):
        return None
    value = shown(" | ".join(origins))
    return Refusal(403, "origin not allowed", value,
                   f"cross-origin request refused: Origin '{value}' is not this dashboard's\n")


def _bad_host(reason: str, raw: str) -> Refusal:
    value = shown(raw)
    return Refusal(400, reason, value, f"Invalid HTTP Host header '{value}': {reason} "
                                       "(see the web_allowed_hosts setting)\n")


def origin_allowed(origin: str, host_header: str | None, hosts: AllowedHosts | None) -> bool:
    """An http(s) origin naming the Host the request names; with ``hosts``, an allowed one."""
    if host_header is None:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return False
    # Same host and port as the request: another port of this machine is another origin.
    if parts.netloc.lower() != host_header.lower():
        return False
    return hosts is None or _allowed(parts.netloc, hosts)


def _allowed(text: str, hosts: AllowedHosts) -> bool:
    host = host_of(text)
    return host is not None and hosts.allows(host)


def _target_authority(scope: Scope) -> str | None:
    """The host of an absolute-form request target (``GET http://host/ HTTP/1.1``), which
    HTTP says wins over Host; servers that keep it pass it in ``raw_path``."""
    target = scope.get("raw_path") or b""
    if not isinstance(target, bytes) or target.startswith(b"/") or b"://" not in target:
        return None
    try:
        return urlsplit(target.decode("latin-1")).netloc
    except ValueError:
        return ""


def header_values(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope.get("headers", [])
            if key.lower() == name]


def server_address(scope: Scope) -> str | None:
    """``host:port`` of the address the connection reached, as a Host header writes it."""
    server = scope.get("server")
    if not server or not isinstance(server[0], str):
        return None
    host, port = server[0], server[1]
    host = f"[{host}]" if ":" in host else host
    return host if port is None else f"{host}:{port}"


def shown(value: str) -> str:
    """``value`` cut, with anything but printable ASCII escaped: one safe line in a log
    or a plain-text reply."""
    escaped = value[:_SHOWN].encode("ascii", "backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    return escaped + ("..." if len(value) > _SHOWN else "")

"""Addresses the settings give as text: the health listener and the statsd agent.

Parsed here, at the settings layer, so a bad value is refused when the
config is built, with the same message the listener or sender would give.
"""

from __future__ import annotations

import urllib.parse

# A listener given without a host binds the loopback interface only.
DEFAULT_HOST = "127.0.0.1"


def parse_listen(raw: str) -> tuple[str, int]:
    """``health_listen`` as (host, port); ValueError says what is wrong."""
    text = raw.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError("must be host:port (or :port) with a port from 0 to 65535")
    if ":" in host and not text.startswith("["):
        raise ValueError("must put an IPv6 host in brackets, as [::1]:9100")
    return host or DEFAULT_HOST, int(port_text)


def listen_address(raw: str, index: int = 0) -> tuple[str, int]:
    """Where swarm child ``index`` listens: a fixed port plus the index; port 0 stays 0."""
    host, port = parse_listen(raw)
    if port and port + index > 65535:
        raise ValueError(f"health_listen port {port} + child index {index} exceeds 65535")
    return host, port + index if port else 0


def parse_metrics_url(url: str) -> tuple[str, int]:
    """``udp://host:port`` as (host, port); ValueError says what is wrong."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("must be udp://host:port with a port from 1 to 65535") from None
    if parts.scheme != "udp" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError("must be udp://host:port (statsd speaks UDP)")
    if port is None or not 0 < port < 65536:
        raise ValueError("must be udp://host:port with a port from 1 to 65535")
    return parts.hostname, port

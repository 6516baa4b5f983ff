"""``wurk web``: serve the dashboard with uvicorn.

Duties:
1. :func:`bind_socket`: listen before serving, so the printed URL names the
   real port even for ``--port 0``.
2. :func:`allowed_hosts`: the hosts it answers besides the loopback names:
   the ``--bind`` address (not a wildcard one, which names no host), the
   ``web_allowed_hosts`` setting and each ``--allowed-host``.
3. :func:`serve`: warn when listening beyond loopback without basic auth,
   and when a wildcard address answers only the loopback names; print the
   URL, then run uvicorn on that socket until SIGINT or SIGTERM.
   Its options are declared in ``wurk.cli``, which imports this module
   only when ``wurk web`` runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import sys

from wurk.core.logging import get_logger
from wurk.settings.config import Config
from wurk.settings.hosts import bind_pattern, parse_pattern
from wurk.web import app, require_extra

log = get_logger("wurk.web")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv6 when the host is one)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def allowed_hosts(bind: str, configured: list[str], flagged: list[str]) -> list[str]:
    """Hosts to answer besides the loopback names; ValueError names a bad ``--allowed-host``."""
    for raw in flagged:
        try:
            parse_pattern(raw)
        except ValueError as exc:
            raise ValueError(f"--allowed-host {exc}, got {raw!r}") from None
    try:
        bound = bind_pattern(bind)
    except ValueError:
        bound = None  # not an address one can listen on: binding it fails and says so
    return [*([bound] if bound else []), *configured, *flagged]


def serve(config: Config, args: argparse.Namespace) -> int:
    """Run until stopped; returns the exit status."""
    require_extra("starlette", "jinja2", "uvicorn")
    import uvicorn  # noqa: PLC0415 - after the extra check names a missing one

    try:
        hosts = allowed_hosts(args.bind, config.web_allowed_hosts, args.allowed_host)
    except ValueError as exc:
        print(f"wurk web: {exc}", file=sys.stderr)
        return 1
    application = app(config, read_only=args.read_only, poll_interval=args.poll,
                      allowed_hosts=hosts)
    try:
        sock = bind_socket(args.bind, args.port)
    except (OSError, ValueError) as exc:
        print(f"wurk web: cannot listen on {args.bind}:{args.port}: {exc}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    _warn(config, args, hosts)
    shown = _url_host(host)
    print(f"wurk web: serving http://{shown}:{port}/"
          f"{' (read-only)' if args.read_only else ''}", flush=True)
    server = uvicorn.Server(uvicorn.Config(application, log_level="warning", access_log=False,
                                           lifespan="off"))
    # uvicorn re-raises the signal that stopped it once it has shut down;
    # a no-op handler turns that into a normal exit with status 0.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: None)
    with sock:
        server.run(sockets=[sock])
    return 0


def _warn(config: Config, args: argparse.Namespace, hosts: list[str]) -> None:
    if not _loopback(args.bind) and config.web_password is None:
        print("wurk web: warning: listening beyond this machine without basic auth "
              "(set web_user and web_password, or WURK_WEB_USER and WURK_WEB_PASSWORD)",
              file=sys.stderr)
    if not hosts:
        log.warning("web.loopback_hosts_only", bind=args.bind,
                    hint="listening on every address, but answering only localhost, "
                         "127.0.0.1 and [::1]: name the hosts remote browsers use with "
                         "--allowed-host or web_allowed_hosts")


def _url_host(host: str) -> str:
    """The printed URL's host: a wildcard address is reached (and answered) as loopback."""
    if ipaddress.ip_address(host).is_unspecified:
        return "[::1]" if ":" in host else "127.0.0.1"
    return f"[{host}]" if ":" in host else host

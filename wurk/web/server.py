"""``wurk web``: serve the dashboard with uvicorn.

Duties:
1. :func:`bind_socket`: listen before serving, so the printed URL names the
   real port even for ``--port 0``.
2. :func:`serve`: warn when listening beyond loopback without basic auth,
   print the URL, then run uvicorn on that socket until SIGINT or SIGTERM.
   Its options are declared in ``wurk.cli``, which imports this module
   only when ``wurk web`` runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import sys

from wurk.settings.config import Config
from wurk.web import app, require_extra


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


def serve(config: Config, args: argparse.Namespace) -> int:
    """Run until stopped; returns the exit status."""
    require_extra("starlette", "jinja2", "uvicorn")
    import uvicorn  # noqa: PLC0415 - after the extra check names a missing one

    application = app(config, read_only=args.read_only, poll_interval=args.poll)
    try:
        sock = bind_socket(args.bind, args.port)
    except (OSError, ValueError) as exc:
        print(f"wurk web: cannot listen on {args.bind}:{args.port}: {exc}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if not _loopback(args.bind) and config.web_password is None:
        print("wurk web: warning: listening beyond this machine without basic auth "
              "(set web_user and web_password, or WURK_WEB_USER and WURK_WEB_PASSWORD)",
              file=sys.stderr)
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

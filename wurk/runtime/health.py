"""The health listener: HTTP probes for one worker process (or one swarm child).

Duties:
1. Parse ``health_listen``: ``host:port``, ``[v6host]:port``, ``:port`` or
   ``port``; without a host it binds 127.0.0.1, never every interface.
2. Answer, with JSON bodies, over HTTP/1.0 on a daemon thread of the stdlib
   HTTP server:
   - ``GET /live``: 200 while the heartbeat's last successful beat is at
     most :data:`STALE_BEATS` intervals old (the rule ``wurk-swarm --probe``
     applies to beats in Redis) and no supervised thread (``wurk.core.threads``)
     is down; else 503, naming the dead threads' roles. The body always
     reports the thread deaths and replacements so far;
   - ``GET /ready``: 200 when the process is not quiet and Redis answers
     PING (one attempt, no backoff), else 503;
   - ``GET /metrics``: the Prometheus text of ``wurk.observe.metrics`` when
     ``metrics_prometheus`` is on (404 otherwise).
3. In a swarm, a child adds its index to a non-zero port (port 0 picks a
   free one); the bound port is logged and goes into the heartbeat's info
   as ``health_port``.
4. A fixed port still held by the child being replaced in a rolling restart
   does not fail the boot: binding is retried every second in the background.
5. ``stop`` closes the listener; the launcher starts it before the first
   beat and stops it after the last.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

from wurk.core import threads
from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.core.threads import describe
from wurk.observe import metrics
from wurk.redis.runtime import Runtime, handed
from wurk.settings.addresses import listen_address

if TYPE_CHECKING:
    from wurk.runtime.heartbeat import Heartbeat
    from wurk.settings.config import Config

log = get_logger("wurk.health")
# A beat older than this many heartbeat intervals means the process is not live.
STALE_BEATS = 3
REBIND_PAUSE = 1.0
Response = tuple[int, str, bytes]  # status, content type, body


class HealthChecks:
    """The probe answers, as (HTTP status, JSON body), apart from any HTTP."""

    def __init__(self, config: Config, *, last_beat: Callable[[], float | None],
                 quiet: Callable[[], bool], identity: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 thread_report: Callable[[], dict[str, Any]] = threads.report,
                 runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.last_beat = last_beat
        self.quiet = quiet
        self.identity = identity
        self.clock = clock
        self.thread_report = thread_report

    def live(self) -> tuple[int, dict[str, Any]]:
        beat = self.last_beat()
        limit = STALE_BEATS * self.config.heartbeat_interval
        age = None if beat is None else round(self.clock() - beat, 3)
        report = self.thread_report()
        status = ("stale" if age is None or age > limit
                  else "thread_dead" if report["dead"] else "live")
        return (200 if status == "live" else 503), {
            "status": status, "identity": self.identity, "beat_age": age, "limit": limit,
            "threads": report}

    def ready(self) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"identity": self.identity}
        if self.quiet():
            return 503, {"status": "quiet", **body}
        try:
            self.runtime.pool.run(lambda conn: conn.call("PING"), idempotent=True, attempts=1)
        except Exception as exc:  # noqa: BLE001 - any Redis failure means not ready
            return 503, {"status": "redis_unavailable",
                         "error": f"{type(exc).__name__}: {exc}", **body}
        return 200, {"status": "ready", **body}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Callable[[], Response]]

    def server_bind(self) -> None:
        # HTTPServer's own would look the host up in DNS (getfqdn), which can stall.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "wurk-health"
    timeout = 5.0  # a client that never finishes its request frees the thread

    def do_GET(self) -> None:
        routes = cast(_Server, self.server).routes
        route = routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, kind, body = _json(404, {"error": "not found", "paths": sorted(routes)})
        else:
            try:
                status, kind, body = route()
            except BaseException as exc:  # noqa: BLE001 - a probe answers, it never hangs up
                status, kind, body = _json(500, {"error": f"{type(exc).__name__}: {exc}"})
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health.request", client=self.client_address[0], line=format % args)


def _json(status: int, body: dict[str, Any]) -> Response:
    return status, "application/json", (json.dumps(body) + "\n").encode()


class HealthServer:
    """The listener: bound at ``start``, served on a daemon thread, closed at ``stop``."""

    def __init__(self, address: tuple[str, int], checks: HealthChecks,
                 prometheus: Callable[[], str] | None = None) -> None:
        self.address = address
        self.routes: dict[str, Callable[[], Response]] = {
            "/live": lambda: _json(*checks.live()),
            "/ready": lambda: _json(*checks.ready()),
        }
        if prometheus is not None:
            self.routes["/metrics"] = lambda: (
                200, "text/plain; version=0.0.4; charset=utf-8", prometheus().encode())
        self._server: _Server | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._rebinder = Service("health-bind", self._rebind, first_pause=REBIND_PAUSE,
                                 failed=logged(log, "health.bind_failed", REBIND_PAUSE))

    @property
    def port(self) -> int:
        """The bound port (the configured one while a rebind is pending)."""
        server = self._server
        return int(server.server_address[1]) if server is not None else self.address[1]

    def start(self) -> int:
        """Bind and serve; returns the port. A port in use is retried in the background."""
        try:
            self._bind()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or self.address[1] == 0:
                raise
            log.warning("health.port_busy", host=self.address[0], port=self.address[1])
            self._rebinder.start()
        return self.port

    def _bind(self) -> None:
        host, port = self.address
        server = (_Server6 if ":" in host else _Server)((host, port), _Handler)
        server.routes = self.routes
        with self._lock:
            if self._stopped.is_set():
                server.server_close()
                return
            self._server = server
        threads.start("health", lambda: server.serve_forever(poll_interval=0.2),
                      stopped=self._stopped.is_set)
        log.info("health.listening", host=host, port=self.port, paths=sorted(self.routes))

    def _rebind(self) -> float:
        """One more try at the port; the rebinder ends once bound or refused for good."""
        try:
            self._bind()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return REBIND_PAUSE
            log.error("health.bind_failed", error=describe(exc))
        self._rebinder.stop()
        return 0.0

    def stop(self) -> None:
        self._rebinder.stop()
        with self._lock:
            self._stopped.set()
            server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown()
                server.server_close()


def serve(config: Config, heartbeat: Heartbeat, *, index: int = 0,
          runtime: Runtime | None = None) -> HealthServer:
    """Start the listener ``config.health_listen`` names for this process's heartbeat."""
    if config.health_listen is None:
        raise ValueError("health_listen is not set")
    checks = HealthChecks(config, last_beat=lambda: heartbeat.last_beat,
                          quiet=lambda: heartbeat.quiet, identity=heartbeat.identity,
                          runtime=runtime)
    server = HealthServer(listen_address(config.health_listen, index), checks,
                          _prometheus(metrics.for_config(config)))
    server.start()
    return server


def _prometheus(observed: metrics.Metrics | None) -> Callable[[], str] | None:
    if observed is None or observed.totals is None:
        return None
    totals = observed.totals
    return lambda: totals.render(observed.send_errors)

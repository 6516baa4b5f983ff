"""A fault-injecting TCP proxy for the Redis pool tests (stdlib only).

It listens on 127.0.0.1 (a free port) and relays bytes to a real
redis-server, except when a test arms a fault:

* :meth:`FaultProxy.drop_next_request`: the next client->server bytes are
  NOT forwarded and that client connection is closed; Redis never sees them.
* :meth:`FaultProxy.drop_next_reply`: the next client->server bytes are
  forwarded; once Redis answers (so the command certainly applied) the client
  connection is closed instead of relaying the reply.
* :meth:`FaultProxy.refuse`: stop listening (a dial gets ECONNREFUSED) or
  reset the next ``n`` accepted connections.
* :meth:`FaultProxy.delay`: hold every reply for some seconds.
* :meth:`FaultProxy.half_close`: send FIN to every live client, as a server
  dropping idle connections does; their later bytes are discarded.
* :meth:`FaultProxy.heal` clears every fault; :meth:`FaultProxy.close` stops.

Faults are global (they hit whichever connection sends next), so tests warm
their connections up before arming one. Every thread is a daemon that polls
a stop flag, and :meth:`FaultProxy.close` joins them all.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Callable

_POLL = 0.02  # seconds between stop-flag checks


class _Pair:
    """One proxied connection: the client side and its upstream socket."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.swallow_reply = False
        self.half_closed = False


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._listener: socket.socket | None = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._pairs: set[_Pair] = set()
        self._threads: list[threading.Thread] = []
        self._drop_requests = 0
        self._drop_replies = 0
        self._refuse_left = 0
        self._delay = 0.0
        self.accepted = 0  # connections that reached the accept loop
        self._spawn(self._accept_loop)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- controls ---------------------------------------------------------
    def drop_next_request(self) -> None:
        with self._lock:
            self._drop_requests += 1

    def drop_next_reply(self) -> None:
        with self._lock:
            self._drop_replies += 1

    def refuse(self, n: int | None = None) -> None:
        """Stop listening until :meth:`heal` (``n=None``), or reset the next ``n`` dials."""
        with self._lock:
            if n is not None:
                self._refuse_left = n
                return
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def delay(self, seconds: float) -> None:
        with self._lock:
            self._delay = seconds

    def half_close(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.half_closed = True
            with contextlib.suppress(OSError):
                pair.client.shutdown(socket.SHUT_WR)

    def heal(self) -> None:
        with self._lock:
            self._drop_requests = self._drop_replies = self._refuse_left = 0
            self._delay = 0.0
            if self._listener is None:
                self._listener = self._listen(self.port)

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._threads[0].join(timeout=2)  # the accept loop: no new pumps after it
        for thread in list(self._threads):
            thread.join(timeout=2)

    def threads_alive(self) -> int:
        return sum(thread.is_alive() for thread in self._threads)

    # -- machinery --------------------------------------------------------
    @staticmethod
    def _listen(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(16)
        return sock

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                listener = self._listener
            if listener is None:
                self._stopped.wait(_POLL)
                continue
            try:
                if not select.select([listener], [], [], _POLL)[0]:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):
                continue  # refuse() or close() closed the listener under us
            self._admit(client)

    def _admit(self, client: socket.socket) -> None:
        with self._lock:
            self.accepted += 1
            refuse = self._refuse_left > 0
            self._refuse_left -= int(refuse)
        if refuse:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # an RST: the dial's handshake fails
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.add(pair)
        self._spawn(self._pump, pair)

    def _pump(self, pair: _Pair) -> None:
        try:
            while not self._stopped.is_set() and self._relay_once(pair):
                pass
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            pair.client.close()
            pair.upstream.close()

    def _relay_once(self, pair: _Pair) -> bool:
        """Move one chunk either way; False once the pair must be closed."""
        readable = select.select([pair.client, pair.upstream], [], [], _POLL)[0]
        if pair.client in readable:
            data = pair.client.recv(65536)
            if not data:
                return False
            if not pair.half_closed:
                with self._lock:
                    drop = self._drop_requests > 0
                    self._drop_requests -= int(drop)
                    if not drop and self._drop_replies > 0:
                        self._drop_replies -= 1
                        pair.swallow_reply = True
                if drop:
                    return False
                pair.upstream.sendall(data)
        if pair.upstream in readable:
            data = pair.upstream.recv(65536)
            if not data or pair.swallow_reply:
                return False
            if self._delay:
                self._stopped.wait(self._delay)
            if not pair.half_closed:
                pair.client.sendall(data)
        return True

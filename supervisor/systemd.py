"""sd_notify without dependencies: READY, STATUS, STOPPING and WATCHDOG.

Only the swarm parent talks to systemd. With no ``NOTIFY_SOCKET`` in the
environment every call is a no-op, so the same code runs under Kubernetes,
a terminal or a test.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None) -> None:
        # An address starting with "@" is in Linux's abstract namespace.
        self.address = "\0" + address[1:] if address and address.startswith("@") else address
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls) -> Notifier:
        return cls(os.environ.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def watchdog_interval(self) -> float | None:
        """Half of WatchdogSec (systemd's advice), or None when it is not set for us."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2_000_000
        except ValueError:
            return None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=value`` lines (e.g. ``READY=1``); False when not under systemd."""
        if not self.address:
            return False
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self.address)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

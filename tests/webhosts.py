"""A ``wurk web`` process to send hand-written HTTP requests to (tests/test_web_hosts.py).

:class:`WebProcess` starts ``wurk web --port 0`` on a Redis with extra
arguments and environment, reads the URL it prints, and keeps its stderr
(the log lines) in a file. :func:`send` writes one raw request on a fresh
connection, so a test can put any Host, Origin or request target in it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waiting import wait_for

WURK = str(Path(sys.executable).with_name("wurk"))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


class WebProcess:
    def __init__(self, redis_url: str, workdir: Path, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.log = workdir / f"web-{os.getpid()}-{id(self)}.log"
        with self.log.open("wb") as err:
            self.proc: subprocess.Popen[Any] = subprocess.Popen(
                [WURK, "web", "--port", "0", "--redis-url", redis_url, *args],
                stdout=subprocess.PIPE, stderr=err, text=True,
                env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline()
        found = re.search(r"serving http://(\S+):(\d+)/", self.line)
        if not found:
            self.stop()
            raise AssertionError(f"wurk web did not start: {self.line!r} {self.log_text()!r}")
        self.host, self.port = found.group(1).strip("[]"), int(found.group(2))

    def send(self, request: bytes) -> Reply:
        return send(self.host, self.port, request)

    def get(self, path: str, host: str, *headers: str, method: str = "GET",
            body: str = "") -> Reply:
        """A request with exactly the Host (and headers) given, one connection each."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *headers, "Connection: close"]
        if method == "POST":
            lines += ["Content-Type: application/x-www-form-urlencoded",
                      f"Content-Length: {len(body.encode())}"]
        return self.send(("\r\n".join(lines) + "\r\n\r\n" + body).encode("latin-1"))

    def local(self) -> str:
        """The Host header a browser on this machine sends for the printed URL."""
        return f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self, name: str) -> list[str]:
        return [line for line in self.log_text().splitlines() if f'"{name}"' in line]

    def wait_events(self, name: str, count: int) -> list[str]:
        return wait_for(lambda: len(self.events(name)) >= count and self.events(name),
                        what=f"{count} {name} lines")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()


def send(host: str, port: int, request: bytes) -> Reply:
    with socket.create_connection((host, port), timeout=20) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split()[1]), headers, body.decode("utf-8", "replace"))


def csrf_of(reply: Reply) -> tuple[str, str]:
    """(the page's CSRF field, the Cookie header that matches it)."""
    found = re.search(r'name="csrf" value="([^"]+)"', reply.body)
    assert found, "the page has no CSRF field"
    return found.group(1), "Cookie: " + reply.headers["set-cookie"].split(";")[0]

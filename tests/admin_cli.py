"""Running the ``wurk`` admin commands in process, for the tests that check them.

1. ``cli`` (a fixture) runs ``wurk --redis-url <test redis> ARGS...`` through
   ``wurk.cli.main`` and returns its exit code, stdout and stderr.
2. ``keep_logging`` (an autouse fixture where a module takes it) keeps logs
   out of the captured stdout and restores structlog afterwards.
3. ``columns`` and ``field_lines`` read the human tables; ``swarm_control``
   registers a swarm with the parent's own code.

A test module takes a fixture by assigning it (``cli = admin_cli.cli``).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from conftest import RedisServer

from supervisor.remote import RemoteControl, SwarmSnapshot
from wurk.cli import main
from wurk.core import logging as wlog
from wurk.settings.config import Config

HOST = socket.gethostname()


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


Cli = Callable[..., Result]


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    """Logs to fd 2, never into the captured stdout; restored for later tests, since
    the CLI configures structlog for errors only."""
    saved = structlog.get_config()
    wlog.setup("warning", "json")
    yield
    structlog.configure(**saved)


@pytest.fixture
def cli(redis_server: RedisServer, r: redis.Redis, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``wurk --redis-url <test redis> ARGS...`` in process."""
    def run(*argv: str) -> Result:
        capsys.readouterr()
        try:
            code = main(["--redis-url", redis_server.url, *argv])
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Result(code, out, err)
    return run


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def field_lines(out: str) -> dict[str, str]:
    """``name  value`` lines (names may hold single spaces) as a dict."""
    return {name: value for name, value in (columns(line) for line in out.splitlines())}


def swarm_control(config: Config, children: list[str], **slots: int) -> RemoteControl:
    """A registered swarm, written by the parent's own code (supervisor.remote)."""
    control = RemoteControl(config, Path("topology.toml"), lambda name: None)
    control.refresh(SwarmSnapshot(slots=slots, children=children, state="running"))
    return control

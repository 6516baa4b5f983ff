"""Running the sample Django project (examples/django_project) for the tests.

Each test gets its own SQLite file (``DJANGO_DB``) and the suite's Redis;
every command runs in a subprocess (Django's settings are once per process,
and its fork hooks must not reach the rest of the suite).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer

pytest.importorskip("django")

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "examples" / "django_project"


@dataclass
class Project:
    db: Path
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 60, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, *argv], check=False, cwd=PROJECT,
                              env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail(f"{argv} exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def manage(self, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run("manage.py", *argv, **kwargs)

    def python(self, code: str, **kwargs: Any) -> list[Any]:
        """Run ``code`` with Django set up; its printed lines, each parsed as JSON."""
        script = "import django\ndjango.setup()\n" + code
        done = self.run("-c", script, **kwargs)
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def start(self, *argv: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen([sys.executable, *argv], cwd=PROJECT, env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True)

    def fulfilled(self) -> list[tuple[int, int]]:
        """(order id, worker pid) of every fulfilment row, read straight from SQLite."""
        with contextlib.closing(sqlite3.connect(self.db, timeout=20)) as db:
            return list(db.execute(
                "SELECT order_id, worker_pid FROM orders_fulfilment ORDER BY order_id"))


def stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(timeout)


@pytest.fixture
def unmigrated(tmp_path: Path, redis_server: RedisServer, r: object) -> Project:
    """The project on its own (empty) SQLite file and the suite's Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WURK_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "mysite.settings",
                "DJANGO_DB": str(tmp_path / "db.sqlite3"), "REDIS_URL": redis_server.url,
                "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO)])})
    return Project(tmp_path / "db.sqlite3", env)


@pytest.fixture
def project(unmigrated: Project) -> Project:
    """The project with its tables created."""
    unmigrated.manage("migrate", "-v", "0")
    return unmigrated

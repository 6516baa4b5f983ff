"""The distribution as a user installs it: built from the tree, installed elsewhere.

A checkout's editable install hides packaging mistakes (a module or data file
left out of the wheel, a broken console-script entry point). These tests
build an sdist and a wheel with ``python -m build`` (as the README shows),
install the wheel into a fresh virtualenv outside the tree, and run the
installed ``wurk`` and ``wurk-swarm`` from there: ``--version``, and one real
job through ``wurk run`` against the suite's redis-server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer
from waiting import wait_for

from wurk.version import __version__

ROOT = Path(__file__).resolve().parent.parent
SLOW = pytest.mark.timeout(600)


@dataclass
class Installed:
    dist: Path
    bin: Path

    def run(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True,
                              text=True, timeout=120, check=False, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("packaging")
    dist = base / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=540)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = next(dist.glob("wurk-*.whl"))
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, capture_output=True, timeout=300, cwd=base)
    yield Installed(dist, venv / "bin")


@SLOW
def test_the_sdist_and_wheel_carry_every_package_and_the_type_markers(
        installed: Installed) -> None:
    wheel = next(installed.dist.glob("wurk-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for tree in ("wurk", "supervisor"):
        sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / tree).rglob("*.py")}
        assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
        assert f"{tree}/py.typed" in names
    assert list(installed.dist.glob(f"wurk-{__version__}.tar.gz")), "no sdist was built"


@SLOW
def test_the_installed_commands_report_their_version(installed: Installed,
                                                     tmp_path: Path) -> None:
    assert installed.run("wurk", "--version", cwd=tmp_path).stdout.strip() == \
        f"wurk {__version__}"
    swarm = installed.run("wurk-swarm", "--version", cwd=tmp_path)
    assert swarm.returncode == 0
    assert swarm.stdout.strip() == f"wurk-swarm (wurk {__version__})"


@SLOW
def test_the_installed_wheel_runs_a_job(installed: Installed, tmp_path: Path,
                                        redis_server: RedisServer, r: redis.Redis) -> None:
    # The app lives outside the checkout, so the only wurk it can import is the wheel's.
    (tmp_path / "pkgjobs.py").write_text(textwrap.dedent("""
        import wurk

        @wurk.job(queue="packaging")
        def remember(token: str) -> None:
            import redis, os
            redis.Redis.from_url(os.environ["REDIS_URL"]).set("packaging:done", token)
    """), encoding="utf-8")
    env = {**os.environ, "REDIS_URL": redis_server.url, "PYTHONPATH": str(tmp_path)}
    token = uuid.uuid4().hex
    where = installed.run("python", "-c", "import wurk; print(wurk.__file__)",
                          cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(installed.bin.parent)), where.stdout + where.stderr
    push = f"import pkgjobs; pkgjobs.remember.perform_async({token!r})"
    enqueued = installed.run("python", "-c", push, cwd=tmp_path, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    worker = subprocess.Popen([str(installed.bin / "wurk"), "run", "-r", "pkgjobs",
                               "-q", "packaging", "-c", "2"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: r.get("packaging:done") == token, 30, what="the job ran")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr

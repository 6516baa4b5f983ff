"""The testing how-to's examples run as a user runs them, and touch no Redis.

``examples/testing`` runs under a fresh ``pytest`` (the fixtures come from
the installed plugin), and the Django project's ``orders/tests.py`` under
``manage.py test``; both with ``REDIS_URL`` on a port no Redis answers
(:mod:`no_redis`), which must see no connection attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from no_redis import listening, untouched

ROOT = Path(__file__).resolve().parent.parent


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WURK_", "DJANGO_"))}
    env.update({"REDIS_URL": url, "XDG_STATE_HOME": str(tmp_path / "state"),
                "PYTHONPATH": str(ROOT)})
    return env


def test_the_plain_pytest_and_flask_examples_pass_without_redis(tmp_path: Path) -> None:
    pytest.importorskip("flask")
    with listening() as (url, listener):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing"],
            cwd=ROOT, env=_env(url, tmp_path), capture_output=True, text=True, timeout=120,
            check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "10 passed" in done.stdout
        assert untouched(listener)


def test_the_django_testcase_example_passes_without_redis(tmp_path: Path) -> None:
    pytest.importorskip("django")
    project = ROOT / "examples" / "django_project"
    with listening() as (url, listener):
        env = {**_env(url, tmp_path), "DJANGO_SETTINGS_MODULE": "mysite.settings",
               "DJANGO_DB": str(tmp_path / "db.sqlite3"),
               "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
        done = subprocess.run([sys.executable, "manage.py", "test", "orders", "-v", "2"],
                              cwd=project, env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "Ran 2 tests" in done.stderr and "OK" in done.stderr
        assert untouched(listener)

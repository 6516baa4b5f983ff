"""``-r PATH.py`` registers jobs under the names a normal import gives them (issue 25, item 6).

A client that imports ``myapp.jobs`` pushes ``myapp.jobs.record``; a worker
told ``-r src/myapp/jobs.py`` must register that same name, so it imports
the file as ``myapp.jobs`` (its parent directories that are packages, the
first that is not on ``sys.path``), or refuses with the ``-r`` value to use.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from cli_workers import Worker, child_env
from conftest import RedisServer
from waiting import wait_for

from wurk.cli import EX_CONFIG
from wurk.runtime.loading import dotted_name
from wurk.wire.payload import new_jid

JOBS = textwrap.dedent("""
    import os

    import redis

    import wurk

    from . import helpers

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job
    def record(value):
        _r.rpush("loading:done", helpers.tag(value))
""")
EMAIL = textwrap.dedent("""
    import os

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job
    def send(value):
        _r.rpush("loading:done", f"mail:{value}")
""")


def package_tree(root: Path) -> Path:
    """``root/src/myapp`` (a package with a subpackage); ``src`` itself is not one."""
    app = root / "src" / "myapp"
    (app / "tasks").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "helpers.py").write_text("def tag(value):\n    return f'job:{value}'\n")
    (app / "jobs.py").write_text(JOBS)
    (app / "tasks" / "__init__.py").write_text("")
    (app / "tasks" / "email.py").write_text(EMAIL)
    return app


def push_by_name(r: redis.Redis, cls: str, *args: object) -> None:
    r.sadd("queues", "default")
    r.lpush("queue:default", json.dumps({"class": cls, "args": list(args), "jid": new_jid(),
                                         "queue": "default", "retry": True,
                                         "created_at": time.time()}))


def run_refused(redis_server: RedisServer, cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "wurk.cli", "run", *args], cwd=cwd,
                          env=child_env(redis_server.url, cwd), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == EX_CONFIG, done.stderr
    [line] = done.stderr.splitlines()
    return line


def test_the_dotted_name_walks_up_the_packages(tmp_path: Path) -> None:
    app = package_tree(tmp_path)
    assert dotted_name(app / "jobs.py") == ("myapp.jobs", tmp_path / "src")
    assert dotted_name(app / "tasks" / "email.py") == ("myapp.tasks.email", tmp_path / "src")
    assert dotted_name(app / "__init__.py") == ("myapp", tmp_path / "src")
    assert dotted_name(tmp_path / "loose.py") == ("loose", tmp_path)


def test_wurk_run_by_path_runs_jobs_pushed_by_their_module_name(
        redis_server: RedisServer, r: redis.Redis, tmp_path: Path) -> None:
    package_tree(tmp_path)
    push_by_name(r, "myapp.jobs.record", 1)
    push_by_name(r, "myapp.tasks.email.send", 2)
    worker = Worker(["-r", "src/myapp/jobs.py", "-r", "src/myapp/tasks/email.py"],
                    child_env(redis_server.url, tmp_path), tmp_path)
    try:
        wait_for(lambda: len(r.lrange("loading:done", 0, -1)) == 2
                 or worker.proc.poll() is not None, timeout=30, what="both jobs ran")
        assert sorted(r.lrange("loading:done", 0, -1)) == ["job:1", "mail:2"], worker.stderr()
        assert r.zcard("retry") == 0
        worker.send(signal.SIGTERM)
        assert worker.wait(10) == 0, worker.stderr()
    finally:
        worker.close()


def test_a_path_that_another_module_of_that_name_shadows_is_refused_with_the_r_to_use(
        redis_server: RedisServer, tmp_path: Path) -> None:
    package_tree(tmp_path)
    package_tree(tmp_path / "old")
    line = run_refused(redis_server, tmp_path, "-r", "src/myapp/jobs.py",
                       "-r", "old/src/myapp/jobs.py")
    assert line.startswith("wurk: cannot load jobs: old/src/myapp/jobs.py:")
    assert "use -r myapp.jobs" in line


@pytest.mark.parametrize("file", ["my-jobs.py", "pkg/2fast.py"])
def test_a_path_no_import_could_name_is_refused(redis_server: RedisServer, tmp_path: Path,
                                                file: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / file).write_text("import wurk\n\n@wurk.job\ndef f():\n    pass\n")
    line = run_refused(redis_server, tmp_path, "-r", file)
    assert line.startswith(f"wurk: cannot load jobs: {file}:")
    assert "rename" in line

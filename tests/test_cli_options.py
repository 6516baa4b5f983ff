"""``wurk run`` takes ``--redis-url`` and ``-C`` where a person types them:
after ``run``, as ``wurk --help`` lists them before it, or before it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from cli_workers import Worker, child_env, jobs_dir, push  # noqa: F401 - fixture
from conftest import RedisServer, free_port
from waiting import wait_for


def environment(redis_server: RedisServer, where: Path) -> dict[str, str]:
    """REDIS_URL is the test server (the job module's own client uses it), but
    WURK_REDIS_URL, which beats it, points nowhere: only the flag or file can win."""
    env = child_env(redis_server.url, where)
    env["WURK_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    return env


def runs_a_job(worker: Worker, r: redis.Redis) -> None:
    try:
        wait_for(lambda: r.llen("cli:done") == 1 or worker.proc.poll() is not None,
                 what="the job ran")
        assert worker.proc.poll() is None, worker.stderr()
        worker.send(signal.SIGTERM)
        assert worker.wait(10) == 0, worker.stderr()
    finally:
        worker.close()


@pytest.mark.parametrize("where", ["after", "before"])
def test_redis_url_works_before_or_after_run(redis_server: RedisServer, r: redis.Redis,
                                             jobs_dir: Path, where: str) -> None:  # noqa: F811
    push(r, "cli_echo", 1)
    flag = ("--redis-url", redis_server.url)
    env = environment(redis_server, jobs_dir)
    worker = (Worker(["-r", "clijobs"], env, jobs_dir, before_run=flag) if where == "before"
              else Worker(["-r", "clijobs", *flag], env, jobs_dir))
    runs_a_job(worker, r)


def test_config_file_works_before_run(r: redis.Redis, redis_server: RedisServer,
                                      jobs_dir: Path) -> None:  # noqa: F811
    (jobs_dir / "w.toml").write_text(f'[wurk]\nredis_url = "{redis_server.url}"\n'
                                     'require = ["clijobs"]\n')
    push(r, "cli_echo", 1)
    env = environment(redis_server, jobs_dir)
    clash = subprocess.run([sys.executable, "-m", "wurk.cli", "-C", "w.toml", "run",
                            "-C", "other.toml"], cwd=jobs_dir, env=env, capture_output=True,
                           text=True, timeout=30, check=False)
    assert clash.returncode == 2 and "different values" in clash.stderr
    runs_a_job(Worker([], env, jobs_dir, before_run=("-C", "w.toml")), r)

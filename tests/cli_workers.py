"""``wurk run`` subprocesses for the tests that run the real entry point.

1. ``Worker`` starts one ``wurk run`` child with its stderr in a file (a pipe
   could fill and block it) and reads its JSON log events back.
2. ``spawn`` (a fixture) starts workers on the test Redis with the jobs of
   ``JOBS_MODULE`` (written by the ``jobs_dir`` fixture) and kills what is
   left afterwards; ``child_env`` is the environment it gives them.
3. ``push`` writes a job as Sidekiq would; ``registered_identity`` waits for
   the one live process in ``processes``.
4. ``wait_quiet`` waits until a quieted worker has no thread left that could
   run a job; with ``waiting.wait_beats`` (it went on running) a test can say
   "it did not take the job" after the worker had every chance.

A test module takes the fixtures by assigning them (``spawn = cli_workers.spawn``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer
from waiting import wait_for, whole_thread_dump

from wurk.wire.payload import new_jid

REPO = Path(__file__).resolve().parent.parent


JOBS_MODULE = textwrap.dedent("""
    import os
    import time

    import redis

    import wurk

    _r = redis.Redis.from_url(os.environ["REDIS_URL"])


    @wurk.job(name="cli_echo")
    def echo(value):
        _r.rpush("cli:done", str(value))


    @wurk.job(name="cli_slow")
    def slow(value):
        _r.rpush("cli:started", str(value))
        time.sleep(30)


    @wurk.job(name="cli_loop")
    def loop(value):
        # A minute of short sleeps: a cancel lands between two of them.
        _r.rpush("cli:started", str(value))
        for _ in range(1200):
            time.sleep(0.05)


    @wurk.job(name="cli_push_later")
    def push_later(flag):
        _r.rpush("cli:started", flag)
        while not os.path.exists(flag):
            time.sleep(0.05)
        echo.perform_async("pushed during the outage")
        time.sleep(30)


    @wurk.job(name="cli_touch")
    def touch(path, value):
        # No Redis write: this job must run where Redis refuses writes.
        with open(path, "a") as fh:
            fh.write(f"{value}\\n")
""")


def child_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env.update({
        "REDIS_URL": redis_url,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "WURK_HEARTBEAT_INTERVAL": "0.2",
        "WURK_POLL_INTERVAL_AVERAGE": "0.2",
        # Idle threads leave their BRPOP within this on stop; keeps tests quick.
        "WURK_FETCH_TIMEOUT": "0.5",
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("DYNO", None)
    return env


class Worker:
    """One ``wurk run`` child with its stderr in a file (a pipe could fill and block it)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path,
                 before_run: tuple[str, ...] = ()) -> None:
        self.stderr_path = cwd / f"stderr-{new_jid()}.log"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wurk.cli", *before_run, "run", *args], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
        )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.stderr().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                found.append(event)
        return found

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._stderr.close()


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    (tmp_path / "clijobs.py").write_text(JOBS_MODULE)
    return tmp_path


@pytest.fixture
def spawn(redis_server: RedisServer, r: redis.Redis, jobs_dir: Path) -> Iterator[
        Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(*args: str, **env_extra: str) -> Worker:
        env = child_env(redis_server.url, jobs_dir)
        env.update(env_extra)
        worker = Worker(list(args), env, jobs_dir)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()


def push(r: redis.Redis, cls: str, *args: Any, queue: str = "default") -> tuple[str, str]:
    jid = new_jid()
    now = time.time()
    raw = json.dumps({"retry": True, "queue": queue, "class": cls, "args": list(args),
                      "jid": jid, "created_at": now, "enqueued_at": now})
    r.sadd("queues", queue)
    r.lpush(f"queue:{queue}", raw)
    return jid, raw


def registered_identity(r: redis.Redis, worker: Worker) -> str:
    def one() -> str | None:
        assert worker.proc.poll() is None, worker.stderr()
        members = r.smembers("processes")
        return next(iter(members)) if len(members) == 1 else None

    # A Python start-up plus wurk's imports: seconds on a loaded CI machine.
    identity: str = wait_for(one, timeout=30, what="the worker registered")
    return identity


def thread_names(worker: Worker) -> list[str]:
    """The worker's threads, from one whole SIGTTIN dump."""
    seen = len(worker.events())

    def dumped() -> list[str]:
        return [e["thread"] for e in worker.events()[seen:] if e.get("event") == "thread.dump"]

    return whole_thread_dump(lambda: worker.send(signal.SIGTTIN), dumped)


def wait_quiet(r: redis.Redis, worker: Worker, identity: str) -> None:
    """Quiet as Redis shows it, and no processor thread left to run a job."""
    wait_for(lambda: r.hget(identity, "quiet") == "true", 15, what="quiet in the heartbeat")
    wait_for(lambda: not [n for n in thread_names(worker) if n.startswith("wurk-processor")],
             30, what="the processor threads gone")

"""Running ``wurk-swarm`` for the tests: a real parent, real forks, a real redis-server.

1. ``launch`` (a fixture) writes a topology and a jobs module, then starts the
   swarm as a subprocess in its own session with its JSON-lines stderr in a
   file; afterwards it kills each swarm's whole process group, so nothing
   outlives a test.
2. ``SwarmProcess`` reads those log events, finds the children with psutil
   and sees them as Sidekiq does (the ``processes`` set and each identity hash);
   a child's SIGTTIN thread dump shows when its quiet has taken effect.
3. Small shared helpers: topology ``slot`` text, a raw ``push``, ``gone``,
   log event times, and the systemd notify socket (a fixture) with its readers.
4. ``aof_redis_server`` (a fixture standing in for ``redis_server``) and
   ``restart_from_aof``: a server whose fsync-always AOF survives a SIGKILL,
   for tests that crash Redis under a swarm; ``PER_PID_REDIS``, the jobs
   modules' per-process Redis client.

A test module takes a fixture by assigning it (``launch = swarms.launch``):
pytest finds fixtures by the names a test module holds, and here ``launch``
stands in for conftest's in-process launcher of the same name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from conftest import RedisServer, reap_probe_clients, start_redis
from waiting import wait_for, whole_thread_dump

from wurk.wire.payload import new_jid

REPO = Path(__file__).resolve().parent.parent
Key = tuple[str, int]


# The start of a test's jobs module: one Redis client per process, so a
# forked child never shares its parent's socket.
PER_PID_REDIS = textwrap.dedent("""
    import os

    import redis

    _clients = {}


    def r():
        pid = os.getpid()
        if pid not in _clients:
            _clients[pid] = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
        return _clients[pid]
""")


JOBS_MODULE = PER_PID_REDIS + textwrap.dedent("""
    import time

    import wurk


    @wurk.job(name="record")
    def record(tag):
        r().rpush("done", f"{tag}:{os.getpid()}")


    @wurk.job(name="slow_incr")
    def slow_incr(key, seconds):
        r().rpush("started", f"{key}:{os.getpid()}")
        time.sleep(seconds)
        r().incr(key)


    @wurk.job(name="hog")
    def hog(megabytes, seconds):
        ballast = b"x" * (megabytes * 1024 * 1024)  # written, so it counts in RSS
        r().rpush("hogging", os.getpid())
        time.sleep(seconds)
        return len(ballast)
""")


BASE_SETTINGS: dict[str, Any] = {
    "require": ["swarm_jobs"],
    "log_level": "info",
    "log_format": "json",
    "heartbeat_interval": 0.5,
    "fetch_timeout": 0.5,
    "shutdown_timeout": 2,
    "shutdown_grace": 2,
}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def slot(name: str, **settings: Any) -> str:
    lines = ["[[slot]]", f"name = {toml_value(name)}"]
    lines += [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def push(r: redis.Redis, queue: str, cls: str, *args: Any) -> str:
    jid = new_jid()
    now = time.time()
    payload = {"class": cls, "args": list(args), "queue": queue, "jid": jid, "retry": False,
               "created_at": now, "enqueued_at": now}
    r.sadd("queues", queue)
    r.lpush(f"queue:{queue}", json.dumps(payload))
    return jid


def queued_jids(r: redis.Redis, queue: str) -> list[str]:
    return [json.loads(raw)["jid"] for raw in r.lrange(f"queue:{queue}", 0, -1)]


def gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs nothing any more)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def event_time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


@dataclass
class SwarmProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    r: redis.Redis
    layout: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def events(self, name: str | None = None, **match: Any) -> list[dict[str, Any]]:
        needle = f'"event": "{name}"'.encode() if name else b""
        found = []
        with self.log_path.open("rb") as fh:
            for line in fh:
                if needle not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if name is not None and event.get("event") != name:
                    continue
                if all(event.get(k) == v for k, v in match.items()):
                    found.append(event)
        return found

    def wait_events(self, name: str, count: int = 1, timeout: float = 10.0,
                    **match: Any) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            events = self.events(name, **match)
            return events if len(events) >= count else None
        return wait_for(enough, timeout, what=f"{count} x {name} {match}")  # type: ignore[no-any-return]

    def thread_names(self, pid: int) -> list[str]:
        """Child ``pid``'s threads, from one whole SIGTTIN dump."""
        seen = len(self.events("thread.dump", pid=pid))

        def dumped() -> list[str]:
            return [e["thread"] for e in self.events("thread.dump", pid=pid)[seen:]]

        return whole_thread_dump(lambda: os.kill(pid, signal.SIGTTIN), dumped)

    def wait_processors_gone(self, pid: int) -> None:
        """Child ``pid`` has no processor thread left that could run a job: its
        quiet has taken effect, not merely arrived."""
        wait_for(lambda: not [n for n in self.thread_names(pid) if n.startswith("wurk-processor")],
                 30, what=f"child {pid} without processor threads")

    def child_pids(self) -> set[int]:
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return set()
        return {c.pid for c in children if not gone(c.pid)}

    def ready(self) -> dict[Key, dict[str, Any]]:
        """(slot, index) -> info of each live child that is registered in ``processes``."""
        pids = self.child_pids()
        found: dict[Key, dict[str, Any]] = {}
        for identity in self.r.smembers("processes"):
            fields = self.r.hgetall(identity)
            if "info" not in fields:
                continue
            info = json.loads(fields["info"])
            if info.get("swarm_pid") != self.pid or info.get("pid") not in pids:
                continue
            info["hash"] = fields
            found[(info["slot"], info["index"])] = info
        return found

    def wait_ready(self, layout: dict[str, int] | None = None, timeout: float = 15.0,
                   not_pids: set[int] | None = None) -> dict[Key, dict[str, Any]]:
        """Wait until exactly the layout's children run and are registered."""
        layout = layout or self.layout
        expected = {(name, i) for name, n in layout.items() for i in range(n)}

        def check() -> dict[Key, dict[str, Any]] | None:
            ready = self.ready()
            if set(ready) != expected or len(self.child_pids()) != len(expected):
                return None
            if not_pids and any(info["pid"] in not_pids for info in ready.values()):
                return None
            return ready
        return wait_for(check, timeout, what=f"children {sorted(expected)} ready")  # type: ignore[no-any-return]

    def pid_at(self, key: Key) -> int:
        return int(self.ready()[key]["pid"])

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)


Launch = Callable[..., SwarmProcess]


@pytest.fixture
def launch(tmp_path: Path, redis_server: RedisServer, r: redis.Redis) -> Iterator[Launch]:
    started: list[SwarmProcess] = []
    (tmp_path / "swarm_jobs.py").write_text(JOBS_MODULE, encoding="utf-8")

    def start(*slots: str, env: dict[str, str] | None = None, script: Path | None = None,
              layout: dict[str, int] | None = None, **settings: Any) -> SwarmProcess:
        wurk = {"redis_url": redis_server.url, **BASE_SETTINGS, **settings}
        text = "[wurk]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in wurk.items())
        topology = tmp_path / f"topology-{len(started)}.toml"
        topology.write_text(text + "\n" + "\n".join(slots), encoding="utf-8")
        log_path = tmp_path / f"swarm-{len(started)}.log"
        child_env = {k: v for k, v in os.environ.items()
                     if not k.startswith(("WURK_", "NOTIFY_SOCKET", "WATCHDOG_"))}
        child_env.update({
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
            "TEST_REDIS_URL": redis_server.url,
            "REDIS_URL": redis_server.url,
            **(env or {}),
        })
        argv = ([sys.executable, str(script), str(topology)] if script else
                [sys.executable, "-m", "supervisor.cli", "--topology", str(topology)])
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=log_file, cwd=tmp_path, env=child_env,
                                    start_new_session=True)
        swarm = SwarmProcess(proc, log_path, r, layout or {})
        started.append(swarm)
        return swarm

    yield start
    for swarm in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(swarm.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            swarm.proc.wait(10)


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # A short directory: AF_UNIX paths are limited to about 108 bytes.
    directory = tempfile.mkdtemp(prefix="wurk-notify-")
    path = os.path.join(directory, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield sock, path
    sock.close()
    with contextlib.suppress(OSError):
        os.unlink(path)
        os.rmdir(directory)


def receive(sock: socket.socket, timeout: float) -> dict[str, str]:
    sock.settimeout(timeout)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)


def watchdog_pings(sock: socket.socket, seconds: float) -> int:
    pings = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            pings += receive(sock, left).get("WATCHDOG") == "1"
        except TimeoutError:
            break
    return pings


AOF = ("--appendonly", "yes", "--appendfsync", "always")



@pytest.fixture
def aof_redis_server() -> Iterator[RedisServer]:
    """The test's own server, with an AOF that survives a SIGKILL (assign it to
    ``redis_server``); ``restart_from_aof`` crashes and restarts it."""
    server = start_redis(*AOF)
    reap_probe_clients()
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
    server.proc.wait(10)
    shutil.rmtree(server.workdir, ignore_errors=True)


def restart_from_aof(server: RedisServer) -> None:
    server.proc.kill()  # a crash: only the AOF survives
    server.proc.wait(5)
    time.sleep(0.5)
    again = start_redis(*AOF, "--dir", server.workdir, port=server.port)
    server.proc = again.proc
    reap_probe_clients()

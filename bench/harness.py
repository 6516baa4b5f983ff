"""Side-by-side harness: wurk against Sidekiq, Huey, Dramatiq, arq, Celery and RQ.

    python bench/harness.py                       # every system, every shape, 3 rounds
    python bench/harness.py --quick               # wurk only, 5 000 no-op jobs, 1 round (CI smoke)
    python bench/harness.py --systems wurk,huey --shape noop --runs 5 --jobs 50000

Run it with an interpreter that has wurk, redis-py and psutil installed (the
project's venv). It starts ONE private redis-server (free loopback port, temp
dir, no persistence) and, for every round, shape and system (round-robin, so
machine drift spreads over all systems alike), does one run:

1. FLUSHALL, then enqueue N jobs with the system's own client (bulk where it
   has one) in a subprocess: **enqueue jobs/s**.
2. CONFIG RESETSTAT, start the system's workers, poll ``bench:done`` (every job
   INCRs it) every 5 ms: **drain jobs/s** = N / (worker start -> last job
   done), **steady jobs/s** = N / (first -> last job), **boot s** (start ->
   first job done). Redis INFO when the last job is done gives **calls/job**
   (every command, including those run inside Lua scripts), **top-level
   calls/job** (calls less those run inside EVAL/EVALSHA; see step 5) and
   **reads/job** (Redis socket reads: round trips, a pipeline counting once).
   A thread samples RSS and USS of every process of the workers' trees every
   100 ms: peak per process and peak of the sum.
3. Latency: with the workers warm, push jobs one at a time at a fixed rate
   (1 000/s for 5 s) carrying their enqueue time; each job RPUSHes now - that
   time to ``bench:lat``: **p50 / p99 ms** push-to-start latency.
4. SIGTERM the workers (SIGKILL of their process groups in ``finally``).
5. Only for a system and shape whose drain ran Lua scripts, once: a small
   drain (2 000 jobs) under MONITOR tells, per command name, which share of
   its calls ran inside scripts; step 2 subtracts that share of each
   command's calls for top-level calls/job.

Job shapes: noop (INCR), cpu (~2 ms arithmetic loop holding the GIL, then
INCR), io (sleep 10 ms, then INCR). Peers are installed from PyPI into one
virtualenv each under bench/.peers-venv (git-ignored); Ruby Sidekiq is Debian's
``sidekiq`` when it is on PATH. Output: markdown tables on stdout and a JSON
file with every run. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: make ``bench.peers`` importable
    sys.path.insert(0, str(ROOT))

from bench.peers.common import DONE_KEY, LAT_KEY, SHAPES  # noqa: E402

POLL = 0.005
# Jobs at once in each asyncio child of the wurk-aio system.
AIO_CONCURRENCY = 500
SAMPLE = 0.100
MONITOR_JOBS = 2000
SCRIPT_COMMANDS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
PEERS_VENV = ROOT / "bench" / ".peers-venv"
RESULTS = ROOT / "bench" / "results"

# One virtualenv per peer library (arq 0.28 needs redis-py < 6, Celery 5.7's
# kombu needs >= 6.4, so they cannot share one). Versions are those of
# /work/shared/bench-anchors.md; redis-py and hiredis are left to pip.
PEER_SPECS: dict[str, list[str]] = {
    "rq": ["rq==3.0.0", "redis", "hiredis"],
    "celery": ["celery[redis]==5.7.0", "kombu==5.7.0", "billiard==4.3.2", "hiredis"],
    "dramatiq": ["dramatiq[redis]==2.2.1", "hiredis"],
    "arq": ["arq==0.28.0"],  # pulls redis[hiredis] < 6
    "huey": ["huey==3.5.4", "redis", "hiredis"],
}
VERSION_PACKAGES = ["rq", "celery", "kombu", "billiard", "dramatiq", "arq", "huey",
                    "redis", "hiredis"]


class UnavailableError(Exception):
    """A system cannot run here (not installed, failed to install); skipped."""


class RunFailedError(Exception):
    """One run of one system failed; recorded, the harness goes on."""


# --------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------

@dataclass
class Env:
    """What a system needs to start: the Redis URL and a scratch directory."""

    url: str
    scratch: Path
    python: str = sys.executable  # the interpreter for this system's Python code
    bindir: Path = Path(sys.executable).parent
    sidekiq_driver: str = "ruby"
    pythonpath: list[str] = field(default_factory=list)  # ahead of ROOT (wurk --wurk-ref)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("WURK_", "PYTHON", "VIRTUAL_ENV"))}
        env["REDIS_URL"] = self.url
        env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, str(ROOT)])
        env["PATH"] = os.pathsep.join([str(self.bindir), env.get("PATH", "")])
        env["BENCH_SIDEKIQ_DRIVER"] = self.sidekiq_driver
        return env


@dataclass
class System:
    name: str
    family: str  # wurk, sidekiq, or a PEER_SPECS key
    config: str  # human-readable worker configuration
    workers: Callable[[Env, str], list[list[str]]]  # (env, shape) -> one argv per root process
    enqueuer: str  # bench/peers/<enqueuer>_jobs.py, or "sidekiq" for the Ruby script
    enqueue_api: str
    why: str = ""

    def enqueue_argv(self, env: Env, mode: str, *args: str) -> list[str]:
        if self.family == "sidekiq":
            return ["ruby", str(ROOT / "bench" / "peers" / "sidekiq_enqueue.rb"), mode, *args]
        return [env.python, "-m", "bench.peers.run", self.enqueuer, mode, *args]


def _script(env: Env, name: str, module: str) -> list[str]:
    """A console script of env's interpreter, or ``python -m module`` without it."""
    path = env.bindir / name
    return [str(path)] if path.exists() else [env.python, "-m", module]


def _swarm_topology(env: Env, path: Path, module: str, *slot_lines: str) -> Path:
    """A topology of one slot of 2 children running ``module``'s job, reliable fetch."""
    path.write_text(
        "[wurk]\n"
        f'require = ["{module}"]\n'
        f'redis_url = "{env.url}"\n'
        "reliable_fetch = true\n"
        'log_level = "warning"\n'
        "\n[[slot]]\n"
        'name = "bench"\n'
        "count = 2\n"
        'queues = ["default"]\n'
        + "".join(line + "\n" for line in slot_lines)
    )
    return path


def _wurk_swarm(env: Env, shape: str) -> list[list[str]]:
    topology = _swarm_topology(env, env.scratch / "topology.toml", "bench.peers.wurk_jobs",
                               "concurrency = 10")
    return [[*_script(env, "wurk-swarm", "supervisor.cli"), "--topology", str(topology)]]


def _wurk_aio(redis_client: str) -> Callable[[Env, str], list[list[str]]]:
    """A swarm of 2 asyncio children; the job's INCR on plain redis-py or redis.asyncio."""
    def build(env: Env, shape: str) -> list[list[str]]:
        topology = _swarm_topology(
            env, env.scratch / f"topology-aio-{redis_client}.toml", "bench.peers.wurk_aio_jobs",
            f"concurrency = {AIO_CONCURRENCY}", 'executor = "asyncio"',
            f'env = {{ BENCH_AIO_REDIS = "{redis_client}" }}')
        return [[*_script(env, "wurk-swarm", "supervisor.cli"), "--topology", str(topology)]]
    return build


def _wurk_single(env: Env, shape: str) -> list[list[str]]:
    return [[*_script(env, "wurk", "wurk.cli"), "run", "-c", "10", "-r", "bench.peers.wurk_jobs",
             "--log-level", "warning"]]


def _sidekiq(env: Env, shape: str) -> list[list[str]]:
    argv = ["sidekiq", "-c", "10", "-q", "default",
            "-r", str(ROOT / "bench" / "peers" / "sidekiq_jobs.rb")]
    return [argv, list(argv)]


def _huey(env: Env, shape: str) -> list[list[str]]:
    return [[str(env.bindir / "huey_consumer"), "bench.peers.huey_jobs.huey",
             "-k", "process", "-w", "4", "-q"]]


def _dramatiq(env: Env, shape: str) -> list[list[str]]:
    # io jobs sleep: 64 threads per process, as the issue's io figure was taken.
    threads = "64" if shape == "io" else "32"
    return [[str(env.bindir / "dramatiq"), "bench.peers.dramatiq_jobs", "-p", "2", "-t", threads]]


def _arq(env: Env, shape: str) -> list[list[str]]:
    argv = [str(env.bindir / "arq"), "bench.peers.arq_jobs.WorkerSettings",
            "--custom-log-dict", "bench.peers.arq_jobs.LOG_CONFIG"]
    return [argv, list(argv)]


def _celery(env: Env, shape: str) -> list[list[str]]:
    return [[str(env.bindir / "celery"), "-A", "bench.peers.celery_jobs", "worker",
             "-P", "prefork", "-c", "2", "--loglevel", "WARNING"]]


def _rq(worker_class: str | None) -> Callable[[Env, str], list[list[str]]]:
    def build(env: Env, shape: str) -> list[list[str]]:
        argv = [str(env.bindir / "rq"), "worker-pool", "-n", "2", "-u", env.url,
                "-l", "WARNING"]
        if worker_class:
            argv += ["-w", worker_class]
        return [[*argv, "default"]]
    return build


SYSTEMS: list[System] = [
    System("wurk-swarm", "wurk", "wurk-swarm: 1 slot x 2 children, -c 10, reliable_fetch",
           _wurk_swarm, "wurk", "push_bulk, 1 000/call",
           "the production shape: a prefork parent supervising 2 processes of 10 threads"),
    System("wurk-aio", "wurk",
           f"wurk-swarm: 1 slot x 2 children, executor asyncio, -c {AIO_CONCURRENCY}, "
           "reliable_fetch", _wurk_aio("sync"), "wurk_aio", "push_bulk, 1 000/call",
           "the asyncio executor: an async def job, its INCR on plain redis-py"),
    System("wurk-aio-aredis", "wurk",
           f"wurk-swarm: 1 slot x 2 children, executor asyncio, -c {AIO_CONCURRENCY}, "
           "reliable_fetch", _wurk_aio("asyncio"), "wurk_aio", "push_bulk, 1 000/call",
           "as wurk-aio, the job's INCR on redis.asyncio (32 connections per process)"),
    System("wurk-single", "wurk", "wurk run -c 10 (1 process, reliable_fetch)",
           _wurk_single, "wurk", "push_bulk, 1 000/call", "one process, for the record"),
    System("sidekiq", "sidekiq", "2 x sidekiq -c 10", _sidekiq, "sidekiq",
           "push_bulk, 1 000/call (Ruby)", "the protocol's reference implementation"),
    System("huey", "huey", "huey_consumer -k process -w 4", _huey, "huey",
           "task call (1 LPUSH each)", "its best setting on this machine (-w 2: 4 242/s)"),
    System("dramatiq", "dramatiq", "dramatiq -p 2 -t 32 (-t 64 for io)", _dramatiq, "dramatiq",
           "send() loop", "its best setting here (default -t 8: 3 856/s)"),
    System("arq", "arq", "2 procs, max_jobs=100, poll_delay=0.01", _arq, "arq",
           "enqueue_job x100 under gather", "tuned: arq's defaults drain 246/s"),
    System("celery", "celery", "worker -P prefork -c 2", _celery, "celery",
           "apply_async loop", "2 pool processes as the 2 cores (-c 8 is no faster)"),
    System("rq-simple", "rq", "rq worker-pool -n 2 -w SimpleWorker", _rq("rq.worker.SimpleWorker"),
           "rq", "enqueue_many, 1 000/call", "jobs run in the worker process"),
    System("rq-fork", "rq", "rq worker-pool -n 2 (fork per job)", _rq(None), "rq",
           "enqueue_many, 1 000/call", "RQ's default Worker forks a work-horse per job"),
]
BY_NAME = {s.name: s for s in SYSTEMS}
ALIASES = {"wurk": ["wurk-swarm", "wurk-single"], "rq": ["rq-simple", "rq-fork"]}


def select_systems(spec: str) -> list[System]:
    names: list[str] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if item == "all":
            names += [s.name for s in SYSTEMS]
        elif item in ALIASES:
            names += ALIASES[item]
        elif item in BY_NAME:
            names.append(item)
        else:
            raise SystemExit(f"harness: unknown system {item!r}; choose from "
                             f"{', '.join([*BY_NAME, *ALIASES, 'all'])}")
    seen: dict[str, None] = dict.fromkeys(names)
    return [BY_NAME[n] for n in seen]


# --------------------------------------------------------------------------
# Installing the peers
# --------------------------------------------------------------------------

def peer_python(family: str, venvs: Path, log: Callable[[str], None]) -> Path:
    """The interpreter of the family's virtualenv, creating it when missing."""
    spec = PEER_SPECS[family]
    venv = venvs / family
    python = venv / "bin" / "python"
    marker = venv / ".bench-spec"
    wanted = "\n".join(spec) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log(f"installing {family} into {venv}: pip install {' '.join(spec)}")
    shutil.rmtree(venv, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [[base, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *spec]]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            raise UnavailableError(
                f"{family}: `{' '.join(argv[:4])} ...` took over 900 s") from None
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise UnavailableError(f"{family}: `{' '.join(argv[:4])} ...` failed "
                                   f"(exit {done.returncode}):\n{tail}")
    marker.write_text(wanted)
    return python


def python_versions(python: str) -> dict[str, str]:
    code = ("import json, importlib.metadata as m\n"
            f"names = {VERSION_PACKAGES!r}\n"
            "out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))\n")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def wurk_setup(ref: str | None, url: str, scratch: Path) -> tuple[Env, dict[str, str]]:
    """wurk from the work tree, or (``--wurk-ref``) from a git commit extracted to scratch."""
    env = Env(url, scratch)
    if ref:
        done = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref,
                               "wurk", "supervisor"], capture_output=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SystemExit(f"harness: git archive {ref} failed: {done.stderr.decode()[-300:]}")
        src = scratch / "wurk-src"
        src.mkdir()
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            tar.extractall(src, filter="data")
        env.pythonpath = [str(src)]
        sha = git("rev-parse", "--short", ref)
        source = f"git {ref} = {sha}"
    else:
        source = f"work tree {git('describe', '--always', '--dirty')}"
    check = subprocess.run([env.python, "-c", "import wurk, supervisor; print(wurk.__version__)"],
                           cwd=ROOT, env=env.base_env(), capture_output=True, text=True,
                           timeout=60, check=False)
    if check.returncode != 0:
        raise UnavailableError(f"wurk does not import: {check.stderr.strip()[-400:]}")
    return env, {"wurk": check.stdout.strip(), "source": source,
                 **python_versions(sys.executable)}


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.stdout.strip() or "?"


def sidekiq_setup() -> tuple[str, dict[str, str]]:
    """(redis-rb driver, versions) for Debian's Ruby Sidekiq; UnavailableError when absent."""
    if shutil.which("sidekiq") is None or shutil.which("ruby") is None:
        raise UnavailableError("sidekiq: no `sidekiq` on PATH (apt-get install ruby-sidekiq "
                               "ruby-hiredis)")
    code = 'require "sidekiq"; require "redis"; print Sidekiq::VERSION, " ", Redis::VERSION'
    done = subprocess.run(["ruby", "-e", code], capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        raise UnavailableError(
            f"sidekiq: cannot load the sidekiq gem: {done.stderr.strip()[-300:]}")
    sidekiq_version, redis_rb = done.stdout.split()
    versions = {"sidekiq": sidekiq_version, "redis-rb": redis_rb,
                "ruby": platform_ruby()}
    hiredis = subprocess.run(
        ["ruby", "-e", 'require "hiredis"; require "redis/connection/hiredis"; '
         'print Hiredis::VERSION'], capture_output=True, text=True, timeout=60, check=False)
    if hiredis.returncode == 0:
        versions["ruby-hiredis"] = hiredis.stdout.strip()
        return "hiredis", versions
    return "ruby", versions


def platform_ruby() -> str:
    done = subprocess.run(["ruby", "-e", "print RUBY_VERSION"], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.stdout.strip()


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------

@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, single_connection_client=True,
                           socket_timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[Server]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("harness: redis-server is not installed (apt-get install -y redis-server)")
    workdir = tempfile.mkdtemp(prefix="wurk-harness-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--maxclients", "10000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    server = Server(proc, "127.0.0.1", port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                server.client().ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("harness: redis-server did not start") from None
                time.sleep(0.02)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def command_stats(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


class Monitor(threading.Thread):
    """Counts MONITOR lines by origin (a client, or ``lua`` inside a script) and command.

    Lines from ``exclude`` (the harness's own connection) are left out; the
    harness ends the count by sending ``ECHO marker`` on that connection.
    """

    def __init__(self, server: Server, exclude: str, marker: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((server.host, server.port), timeout=60)
        self.sock.sendall(b"MONITOR\r\n")
        self.exclude = exclude.encode()
        self.marker = marker.encode()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        buf = b""
        try:
            while not self.finished.is_set():
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\r\n")
                for line in lines:
                    self.count(line)
        except OSError as exc:
            self.error = exc
        finally:
            self.finished.set()

    def count(self, line: bytes) -> None:
        start = line.find(b" [")
        end = line.find(b"] ", start)
        if start < 0 or end < 0:
            return
        origin = line[start + 2:end].split(b" ", 1)[-1]
        rest = line[end + 2:]
        command = rest[1:rest.find(b'"', 1)].decode(errors="replace").lower()
        if origin == self.exclude:
            if command == "echo" and self.marker in rest:
                self.finished.set()
            return
        self.counts["lua" if origin == b"lua" else "client", command] += 1

    def close(self) -> None:
        self.finished.set()
        with contextlib.suppress(OSError):
            self.sock.close()


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------

class Workers:
    """The root processes of one system's workers, each in its own session."""

    def __init__(self, argvs: list[list[str]], env: dict[str, str], log_dir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.seen: dict[int, psutil.Process] = {}
        for i, argv in enumerate(argvs):
            log = log_dir / f"worker-{i}-{uuid.uuid4().hex[:6]}.log"
            self.logs.append(log)
            with log.open("wb") as out:
                try:
                    self.procs.append(subprocess.Popen(
                        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True))
                except OSError as exc:
                    raise RunFailedError(f"cannot start {argv[0]}: {exc}") from None

    def dead(self) -> str | None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                return f"worker exited with status {proc.returncode}: {tail(log)}"
        return None

    def tree(self) -> list[psutil.Process]:
        procs: list[psutil.Process] = []
        for root in self.procs:
            with contextlib.suppress(psutil.Error):
                parent = self.seen.get(root.pid) or psutil.Process(root.pid)
                self.seen.setdefault(root.pid, parent)
                procs.append(parent)
                for child in parent.children(recursive=True):
                    procs.append(self.seen.setdefault(child.pid, child))
        return procs

    def cpu_seconds(self) -> float:
        """CPU of the live tree, plus what its processes' reaped children used."""
        total = 0.0
        for proc in self.tree():
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    def stop(self, timeout: float) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        return [proc.returncode for proc in self.procs]

    def kill(self) -> None:
        """SIGKILL every process group and every descendant ever seen."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid, p in self.seen.items():
            if pid not in {proc.pid for proc in self.procs}:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


class Sampler(threading.Thread):
    """Every 100 ms: RSS and USS of every process in the workers' trees."""

    def __init__(self, workers: Workers) -> None:
        super().__init__(daemon=True)
        self.workers = workers
        self.stopped = threading.Event()
        self.peak_rss: dict[int, int] = {}
        self.peak_uss: dict[int, int] = {}
        self.peak_total_rss = 0
        self.peak_total_uss = 0
        self.max_procs = 0

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(SAMPLE)

    def sample(self) -> None:
        rss_sum = uss_sum = count = 0
        for proc in self.workers.tree():
            try:
                mem = proc.memory_full_info()
            except psutil.Error:
                continue
            count += 1
            rss_sum += mem.rss
            uss_sum += mem.uss
            self.peak_rss[proc.pid] = max(self.peak_rss.get(proc.pid, 0), mem.rss)
            self.peak_uss[proc.pid] = max(self.peak_uss.get(proc.pid, 0), mem.uss)
        self.peak_total_rss = max(self.peak_total_rss, rss_sum)
        self.peak_total_uss = max(self.peak_total_uss, uss_sum)
        self.max_procs = max(self.max_procs, count)

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)


# --------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------

@dataclass
class Run:
    system: str
    shape: str
    round: int
    jobs: int
    ok: bool = False
    error: str = ""
    enqueue_per_s: float | None = None
    drain_per_s: float | None = None
    steady_per_s: float | None = None
    boot_s: float | None = None
    drained: int = 0
    drain_complete: bool = False
    extra_executions: int = 0  # INCRs past N seen shortly after the drain
    lat_p50_ms: float | None = None
    lat_p99_ms: float | None = None
    lat_max_ms: float | None = None
    lat_samples: int = 0
    lat_sent: int = 0
    lat_push_per_s: float | None = None
    lat_complete: bool = False
    calls_per_job: float | None = None
    script_calls_per_job: float | None = None
    toplevel_calls_per_job: float | None = None
    reads_per_job: float | None = None
    commands: dict[str, int] = field(default_factory=dict)
    peak_rss_mb: float | None = None  # largest single process
    peak_uss_mb: float | None = None
    peak_total_rss_mb: float | None = None  # all processes at one sample
    peak_total_uss_mb: float | None = None
    procs: int = 0
    worker_cpu_us_per_job: float | None = None
    redis_cpu_us_per_job: float | None = None
    exit_codes: list[int | None] = field(default_factory=list)


@dataclass
class Harness:
    server: Server
    args: argparse.Namespace
    envs: dict[str, Env]
    scratch: Path
    # (system, shape) -> {command: share of its calls made inside Lua scripts}, from MONITOR
    inner_share: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    monitor_detail: dict[str, Any] = field(default_factory=dict)

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # -- phases ---------------------------------------------------------
    def enqueue(self, system: System, env: Env, jobs: int, shape: str) -> float:
        argv = system.enqueue_argv(env, "bulk", str(jobs), shape)
        try:
            done = subprocess.run(argv, cwd=ROOT, env=env.base_env(), capture_output=True,
                                  text=True, timeout=self.args.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RunFailedError(
                f"enqueue of {jobs} jobs took over {self.args.timeout:.0f} s") from None
        if done.returncode != 0:
            raise RunFailedError(f"enqueue failed (exit {done.returncode}): "
                                 f"{' | '.join(done.stderr.strip().splitlines()[-6:])}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        queued = self.count_queued()
        if queued is not None and queued < jobs:
            raise RunFailedError(f"enqueue reported {jobs} jobs but Redis holds {queued}")
        return float(result["seconds"])

    def count_queued(self) -> int | None:
        """Jobs sitting in Redis lists after an enqueue (None: unknown)."""
        r = self.server.client()
        total = 0
        for key in r.scan_iter(count=1000, _type="list"):
            total += r.llen(key)
        return total or None  # arq keeps its queue in a sorted set: unknown

    def drain(self, run: Run, r: redis.Redis, workers: Workers, started: float) -> int:
        """Poll the counter until N; fills the drain figures; returns GETs sent."""
        deadline = started + self.args.timeout
        first = 0.0
        polls = 0
        while True:
            done = int(r.get(DONE_KEY) or 0)
            polls += 1
            now = time.perf_counter()
            if done and not first:
                first = now
            if done >= run.jobs:
                break
            problem = workers.dead()
            if problem or now > deadline:
                run.drained = done
                if first and done:
                    run.boot_s = first - started
                    run.drain_per_s = done / (now - started)
                raise RunFailedError(problem or (
                    f"drain timed out after {self.args.timeout:.0f} s with {done} of "
                    f"{run.jobs} jobs done (the JSON keeps the partial rate)"))
            time.sleep(POLL)
        run.drained = done
        run.drain_complete = True
        run.boot_s = first - started
        run.drain_per_s = run.jobs / (now - started)
        run.steady_per_s = run.jobs / (now - first) if now > first else None
        return polls

    def latency(self, run: Run, system: System, env: Env, r: redis.Redis,
                workers: Workers) -> None:
        r.set(DONE_KEY, 0)
        r.delete(LAT_KEY)
        rate, seconds = self.args.latency_rate, self.args.latency_seconds
        argv = system.enqueue_argv(env, "paced", f"{rate:g}", f"{seconds:g}", run.shape)
        out = self.scratch / f"paced-{uuid.uuid4().hex[:6]}.out"
        with out.open("wb") as sink:
            pusher = subprocess.Popen(argv, cwd=ROOT, env=env.base_env(), stdout=sink,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + seconds + self.args.latency_timeout
            while pusher.poll() is None:
                if time.monotonic() > deadline:
                    raise RunFailedError("latency enqueuer did not finish in time")
                time.sleep(0.05)
            if pusher.returncode != 0:
                raise RunFailedError(
                    f"latency enqueuer failed (exit {pusher.returncode}): {tail(out)}")
            lines = out.read_text().strip().splitlines()
            result = json.loads(lines[-1])
            run.lat_sent = int(result["jobs"])
            run.lat_push_per_s = run.lat_sent / float(result["seconds"])
            while int(r.get(DONE_KEY) or 0) < run.lat_sent:
                problem = workers.dead()
                if problem or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            else:
                run.lat_complete = True
        finally:
            if pusher.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pusher.pid, signal.SIGKILL)
                pusher.wait()
        samples = sorted(float(x) * 1000 for x in r.lrange(LAT_KEY, 0, -1))
        run.lat_samples = len(samples)
        if samples:
            run.lat_p50_ms = percentile(samples, 50)
            run.lat_p99_ms = percentile(samples, 99)
            run.lat_max_ms = samples[-1]

    def account_scripts(self, system: System, env: Env, shape: str) -> None:
        """Under MONITOR, drain a few jobs; learn commands run per script call."""
        r = self.server.client()
        r.flushall()
        jobs = min(MONITOR_JOBS, self.args.jobs)
        self.enqueue(system, env, jobs, shape)
        addr = str(r.client_info()["addr"])
        marker = f"bench-monitor-end-{uuid.uuid4().hex}"
        monitor = Monitor(self.server, addr, marker)
        monitor.start()
        workers = Workers(system.workers(env, shape), env.base_env(), self.scratch)
        try:
            deadline = time.monotonic() + self.args.timeout
            while (done := int(r.get(DONE_KEY) or 0)) < jobs:
                problem = workers.dead()
                if problem or time.monotonic() > deadline:
                    raise RunFailedError(f"MONITOR drain stopped at {done} of {jobs} jobs: "
                                         f"{problem or 'timed out'}")
                time.sleep(0.02)
            r.echo(marker)
            monitor.finished.wait(60)
        finally:
            monitor.close()
            workers.stop(self.args.stop_timeout)
            workers.kill()
        counts = monitor.counts
        scripts = sum(n for (origin, cmd), n in counts.items()
                      if origin == "client" and cmd in SCRIPT_COMMANDS)
        inner = sum(n for (origin, _), n in counts.items() if origin == "lua")
        if scripts:
            names = {cmd for _, cmd in counts}
            self.inner_share[system.name, shape] = {
                cmd: counts["lua", cmd] / (counts["lua", cmd] + counts["client", cmd])
                for cmd in sorted(names) if counts["lua", cmd]}
        self.monitor_detail[f"{system.name}/{shape}"] = {
            "jobs": jobs,
            "script_calls": scripts,
            "commands_inside_scripts": inner,
            "client_commands_per_job": {cmd: round(n / jobs, 3) for (o, cmd), n
                                        in sorted(counts.items()) if o == "client"},
            "lua_commands_per_job": {cmd: round(n / jobs, 3) for (o, cmd), n
                                     in sorted(counts.items()) if o == "lua"},
        }

    # -- the run --------------------------------------------------------
    def one_run(self, system: System, shape: str, round_: int) -> Run:
        run = Run(system.name, shape, round_, self.args.jobs)
        env = self.envs[system.family]
        workers: Workers | None = None
        sampler: Sampler | None = None
        try:
            r = self.server.client()
            r.flushall()
            run.enqueue_per_s = run.jobs / self.enqueue(system, env, run.jobs, shape)
            r.config_resetstat()
            redis_proc = psutil.Process(self.server.proc.pid)
            redis_cpu = sum(redis_proc.cpu_times()[:2])
            reads = int(r.info("stats")["total_reads_processed"])
            started = time.perf_counter()
            workers = Workers(system.workers(env, shape), env.base_env(), self.scratch)
            sampler = Sampler(workers)
            sampler.start()
            polls = self.drain(run, r, workers, started)
            stats = command_stats(r)
            reads = int(r.info("stats")["total_reads_processed"]) - reads
            run.worker_cpu_us_per_job = workers.cpu_seconds() / run.jobs * 1e6
            redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu
            run.redis_cpu_us_per_job = redis_cpu / run.jobs * 1e6
            self.count_commands(run, stats, polls, reads)
            self.after_drain(run, system, env, r, workers)
            sampler.stop()
            self.shut_down(run, system, workers)
        except RunFailedError as exc:
            run.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - one broken run must not end the harness
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            if sampler is not None:
                sampler.stop()
                self.memory(run, sampler)
            if workers is not None:
                workers.kill()
        if run.ok and (system.name, shape) not in self.inner_share \
                and run.script_calls_per_job and not self.args.no_monitor:
            try:
                self.account_scripts(system, env, shape)
            except Exception as exc:  # noqa: BLE001
                self.log(f"  {system.name}: MONITOR pass failed: {exc}")
        self.apply_inner(run)
        return run

    def after_drain(self, run: Run, system: System, env: Env, r: redis.Redis,
                    workers: Workers) -> None:
        """Check nothing ran twice, then the latency phase with the warm workers."""
        time.sleep(0.2)
        run.extra_executions = int(r.get(DONE_KEY) or 0) - run.jobs
        run.ok = run.drain_complete and run.extra_executions == 0
        if run.extra_executions:
            run.error = f"{run.extra_executions} job(s) ran more than once"
        try:
            self.latency(run, system, env, r, workers)
        except RunFailedError as exc:
            run.error = f"latency phase: {exc}"
        if not run.lat_complete and not run.error:
            run.error = f"latency phase: {run.lat_samples} of {run.lat_sent} jobs started in time"

    def shut_down(self, run: Run, system: System, workers: Workers) -> None:
        run.exit_codes = workers.stop(self.args.stop_timeout)
        if system.family == "wurk" and any(code != 0 for code in run.exit_codes):
            run.ok = False
            run.error = (run.error + "; " if run.error else "") + (
                f"exit status {run.exit_codes} after SIGTERM (None: still running after "
                f"{self.args.stop_timeout:.0f} s)")

    def count_commands(self, run: Run, stats: dict[str, int], polls: int, reads: int) -> None:
        # Leave out the harness's own commands: its GET polls and CONFIG RESETSTAT.
        stats["get"] = stats.get("get", 0) - polls
        stats["config|resetstat"] = stats.get("config|resetstat", 0) - 1
        stats["info"] = stats.get("info", 0) - 1
        stats = {k: v for k, v in stats.items() if v > 0}
        run.commands = stats
        run.calls_per_job = sum(stats.values()) / run.jobs
        run.script_calls_per_job = sum(v for k, v in stats.items()
                                       if k in SCRIPT_COMMANDS) / run.jobs
        run.reads_per_job = max(0, reads - polls - 2) / run.jobs

    def apply_inner(self, run: Run) -> None:
        if run.calls_per_job is None:
            return
        if not run.script_calls_per_job:
            run.toplevel_calls_per_job = run.calls_per_job
            return
        share = self.inner_share.get((run.system, run.shape))
        if share is not None:
            inner = sum(share.get(cmd, 0.0) * calls for cmd, calls in run.commands.items())
            run.toplevel_calls_per_job = run.calls_per_job - inner / run.jobs

    @staticmethod
    def memory(run: Run, sampler: Sampler) -> None:
        if sampler.peak_rss:
            run.peak_rss_mb = max(sampler.peak_rss.values()) / 2**20
            run.peak_uss_mb = max(sampler.peak_uss.values()) / 2**20
            run.peak_total_rss_mb = sampler.peak_total_rss / 2**20
            run.peak_total_uss_mb = sampler.peak_total_uss / 2**20
            run.procs = sampler.max_procs


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# --------------------------------------------------------------------------
# Summary and output
# --------------------------------------------------------------------------

THROUGHPUT = [  # (label, Run attribute, format)
    ("enqueue jobs/s", "enqueue_per_s", "{:,.0f}"),
    ("drain jobs/s", "drain_per_s", "{:,.0f}"),
    ("steady jobs/s", "steady_per_s", "{:,.0f}"),
    ("boot s", "boot_s", "{:.2f}"),
    ("p50 ms", "lat_p50_ms", "{:.1f}"),
    ("p99 ms", "lat_p99_ms", "{:.1f}"),
]
COST = [
    ("calls/job", "calls_per_job", "{:.2f}"),
    ("top-level calls/job", "toplevel_calls_per_job", "{:.2f}"),
    ("EVALSHA/job", "script_calls_per_job", "{:.2f}"),
    ("reads/job", "reads_per_job", "{:.2f}"),
    ("worker CPU µs/job", "worker_cpu_us_per_job", "{:,.0f}"),
    ("redis CPU µs/job", "redis_cpu_us_per_job", "{:,.0f}"),
    ("peak RSS MB/proc", "peak_rss_mb", "{:.1f}"),
    ("peak USS MB/proc", "peak_uss_mb", "{:.1f}"),
    ("peak RSS MB all", "peak_total_rss_mb", "{:.0f}"),
    ("procs", "procs", "{:.0f}"),
]
RATIOS = [("enqueue", "enqueue_per_s"), ("drain", "drain_per_s"), ("p50", "lat_p50_ms"),
          ("p99", "lat_p99_ms"), ("worker CPU/job", "worker_cpu_us_per_job"),
          ("peak RSS/proc", "peak_rss_mb")]


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def usable(run: Run, attr: str) -> float | None:
    value = getattr(run, attr)
    if value is None:
        return None
    if attr.startswith("lat_") and not run.lat_complete:
        return None
    if attr in ("drain_per_s", "steady_per_s") and not run.drain_complete:
        return None
    return float(value)


def summarise(runs: list[Run], systems: list[System], shapes: list[str]) -> dict[str, Any]:
    reference = next((s.name for s in systems if s.family == "wurk"), None)
    summary: dict[str, Any] = {"reference": reference, "shapes": {}}
    for shape in shapes:
        per_system: dict[str, Any] = {}
        for system in systems:
            mine = [x for x in runs if x.system == system.name and x.shape == shape]
            figures = {attr: spread([v for x in mine if (v := usable(x, attr)) is not None])
                       for _, attr, _ in THROUGHPUT + COST}
            ratios: dict[str, Any] = {}
            if reference and system.name != reference:
                for label, attr in RATIOS:
                    pairs = []
                    for x in mine:
                        ref = next((y for y in runs if y.system == reference and y.shape == shape
                                    and y.round == x.round), None)
                        a = usable(ref, attr) if ref else None
                        b = usable(x, attr)
                        if a is not None and b:
                            pairs.append(a / b)
                    ratios[label] = spread(pairs)
            per_system[system.name] = {
                "runs": len(mine), "ok": sum(x.ok for x in mine),
                "errors": [x.error for x in mine if x.error],
                "figures": figures, "ratio_reference_over_system": ratios,
            }
        summary["shapes"][shape] = per_system
    return summary


def cell(fig: dict[str, float] | None, fmt: str, with_range: bool) -> str:
    """``fmt`` is a format string, or "ratio" for 2 decimals that keep small ratios visible."""
    if fig is None:
        return "\u2013"

    def show(value: float) -> str:
        if fmt != "ratio":
            return fmt.format(value)
        return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"

    text = show(fig["median"])
    if with_range and fig["n"] > 1:
        text += f" ({show(fig['min'])}\u2013{show(fig['max'])})"
    return text


def markdown(summary: dict[str, Any], systems: list[System], versions: dict[str, str],
             runs: list[Run], notes: list[str], latency_rate: float) -> str:
    out: list[str] = []
    reference = summary["reference"]
    for shape, per_system in summary["shapes"].items():
        out.append(f"\n### shape `{shape}`: throughput and latency "
                   "(median (min\u2013max) over rounds)\n")
        out.append("| system | version | config | runs ok | "
                   + " | ".join(label for label, _, _ in THROUGHPUT) + " |")
        out.append("|---" * (4 + len(THROUGHPUT)) + "|")
        for system in systems:
            s = per_system[system.name]
            cells = [cell(s["figures"][attr], fmt, True) for _, attr, fmt in THROUGHPUT]
            out.append(f"| {system.name} | {versions.get(system.family, '?')} | {system.config} "
                       f"| {s['ok']}/{s['runs']} | " + " | ".join(cells) + " |")
        out.append(f"\n### shape `{shape}`: cost per job and memory (medians)\n")
        out.append("| system | " + " | ".join(label for label, _, _ in COST) + " |")
        out.append("|---" * (1 + len(COST)) + "|")
        for system in systems:
            s = per_system[system.name]
            cells = [cell(s["figures"][attr], fmt, False) for _, attr, fmt in COST]
            out.append(f"| {system.name} | " + " | ".join(cells) + " |")
        if reference and len(systems) > 1:
            out.append(f"\n### shape `{shape}`: paired per-round ratio {reference} / system "
                       "(median (min\u2013max); > 1 means wurk is higher: better for enqueue and "
                       "drain, worse for latency, CPU and RSS)\n")
            out.append("| system | " + " | ".join(label for label, _ in RATIOS) + " |")
            out.append("|---" * (1 + len(RATIOS)) + "|")
            for system in systems:
                if system.name == reference:
                    continue
                ratios = per_system[system.name]["ratio_reference_over_system"]
                cells = [cell(ratios.get(label), "ratio", True) for label, _ in RATIOS]
                out.append(f"| {system.name} | " + " | ".join(cells) + " |")
    failures = [x for x in runs if x.error]
    slow = [x for x in runs if x.lat_push_per_s and x.lat_push_per_s < 0.9 * latency_rate]
    if failures or notes or slow:
        out.append("\n### notes\n")
        out.extend("- " + note.replace("\n", " | ") for note in notes)
        for x in failures:
            error = x.error.replace("\n", " | ")
            out.append(f"- {x.system} / {x.shape} / round {x.round}: {error}")
        for x in slow:
            out.append(f"- {x.system} / {x.shape} / round {x.round}: the latency enqueuer "
                       f"pushed only {x.lat_push_per_s:,.0f} jobs/s of {latency_rate:,.0f}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="all",
                        help="comma-separated: all, wurk, wurk-swarm, wurk-aio, wurk-aio-aredis, "
                             "wurk-single, "
                             "sidekiq, huey, dramatiq, arq, celery, rq, rq-simple, rq-fork "
                             "(default all)")
    parser.add_argument("--shape", default="all",
                        help="job shapes, comma-separated: noop, cpu, io or all (default all)")
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per drain (default 50000)")
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--latency-rate", type=float, default=1000.0,
                        help="jobs/s pushed in the latency phase (default 1000)")
    parser.add_argument("--latency-seconds", type=float, default=5.0,
                        help="length of the latency phase (default 5)")
    parser.add_argument("--latency-timeout", type=float, default=120.0,
                        help="seconds the latency jobs may take after the last push (default 120)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one enqueue or one drain may take (default 600)")
    parser.add_argument("--stop-timeout", type=float, default=30.0,
                        help="seconds workers get to exit after SIGTERM (default 30)")
    parser.add_argument("--wurk-ref", metavar="GIT_REF",
                        help="run wurk from this commit (git archive into a temp dir) instead of "
                             "the work tree, e.g. HEAD while others edit the tree")
    parser.add_argument("--extra-incrs", type=int, default=0, metavar="N",
                        help="every system's job INCRs another key N times before its "
                             "counted INCR: the difference between N=0 and N=1 is what one "
                             "such call costs inside each worker (default 0)")
    parser.add_argument("--no-monitor", action="store_true",
                        help="skip the MONITOR pass (no top-level calls/job for Lua users)")
    parser.add_argument("--peers-venv", type=Path, default=PEERS_VENV,
                        help=f"where the peers' virtualenvs live (default {PEERS_VENV})")
    parser.add_argument("--json", type=Path, help="JSON output (default "
                        "bench/results/harness-<timestamp>.json)")
    parser.add_argument("--quick", action="store_true",
                        help="CI smoke: wurk only, 5 000 no-op jobs, 1 round; exit 0 only if "
                             "wurk drained every job")
    return parser


def prepare(systems: list[System], args: argparse.Namespace, server: Server, scratch: Path,
            log: Callable[[str], None]) -> tuple[list[System], dict[str, Env], dict[str, str],
                                                 dict[str, Any], list[str]]:
    envs: dict[str, Env] = {}
    versions: dict[str, str] = {}
    packages: dict[str, Any] = {}
    notes: list[str] = []
    ready: list[System] = []
    for family in dict.fromkeys(s.family for s in systems):
        try:
            if family == "wurk":
                env, found = wurk_setup(args.wurk_ref, server.url, scratch)
                versions[family] = f"{found['wurk']} ({found['source']})"
                packages[family] = found
            elif family == "sidekiq":
                driver, found = sidekiq_setup()
                env = Env(server.url, scratch, sidekiq_driver=driver)
                versions[family] = f"{found['sidekiq']} ({driver})"
                packages[family] = found
                if driver != "hiredis":
                    notes.append("sidekiq: ruby-hiredis missing, redis-rb's pure-Ruby driver "
                                 "used (apt-get install ruby-hiredis for the hiredis figure)")
            else:
                python = peer_python(family, args.peers_venv, log)
                env = Env(server.url, scratch, python=str(python), bindir=python.parent)
                packages[family] = python_versions(str(python))
                versions[family] = packages[family].get(family, "?")
        except UnavailableError as exc:
            log(f"harness: skipping {family}: {exc}")
            notes.append(f"skipped {family}: {exc}")
            continue
        envs[family] = env
        ready += [s for s in systems if s.family == family]
    order = {s.name: i for i, s in enumerate(systems)}
    return sorted(ready, key=lambda s: order[s.name]), envs, versions, packages, notes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.systems, args.shape, args.runs = "wurk", "noop", 1
        if args.jobs == 50_000:
            args.jobs = 5_000
        args.timeout = min(args.timeout, 120.0)
        args.latency_timeout = min(args.latency_timeout, 30.0)
    if args.jobs < 1 or args.runs < 1:
        raise SystemExit("harness: --jobs and --runs must be at least 1")
    if args.extra_incrs < 0:
        raise SystemExit("harness: --extra-incrs must be 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Every system's workers inherit the harness's environment (Env.base_env);
    # bench/peers/common.py and sidekiq_jobs.rb read it at load.
    os.environ["BENCH_EXTRA_INCRS"] = str(args.extra_incrs)
    systems = select_systems(args.systems)
    shapes = list(SHAPES) if args.shape == "all" else list(
        dict.fromkeys(x.strip() for x in args.shape.split(",") if x.strip()))
    if not shapes or any(x not in SHAPES for x in shapes):
        raise SystemExit(f"harness: --shape takes {', '.join(SHAPES)} or all, got {args.shape!r}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.json or RESULTS / f"harness-{stamp}.json"

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # SIGTERM (as from `timeout`) unwinds like Ctrl-C, so the finally blocks
    # stop every worker, the enqueuers and redis-server.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    runs: list[Run] = []
    scratch = Path(tempfile.mkdtemp(prefix="wurk-harness-"))
    try:
        with redis_server() as server:
            systems, envs, versions, packages, notes = prepare(systems, args, server, scratch, log)
            harness = Harness(server, args, envs, scratch)
            redis_version = server.client().info("server")["redis_version"]
            log(f"harness: redis {redis_version} on {server.url}; systems "
                f"{', '.join(s.name for s in systems) or '(none)'}; shapes {', '.join(shapes)}; "
                f"{args.jobs} jobs; {args.runs} round(s)")
            for round_ in range(1, args.runs + 1):
                # Rotate the start so no system always follows the same one.
                offset = (round_ - 1) % max(1, len(systems))
                order = systems[offset:] + systems[:offset]
                for shape in shapes:
                    for system in order:
                        run = harness.one_run(system, shape, round_)
                        runs.append(run)
                        log(progress(run))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarise(runs, systems, shapes)
    load = os.getloadavg()
    header = (f"wurk harness {stamp}: {args.jobs:,} jobs per drain, {args.runs} round(s), "
              f"latency {args.latency_rate:g} jobs/s for {args.latency_seconds:g} s; "
              f"redis {redis_version}; Python {platform.python_version()}; "
              f"{psutil.cpu_count()} CPUs; load average at the end {load[0]:.2f}"
              + (f"; {args.extra_incrs} extra INCR(s) per job" if args.extra_incrs else ""))
    print(f"## {header}")
    print(markdown(summary, systems, versions, runs, notes, args.latency_rate))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({
        "header": header, "args": {k: str(v) if isinstance(v, Path) else v
                                   for k, v in vars(args).items()},
        "machine": {"cpus": psutil.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "redis": redis_version,
                    "load_average_end": load},
        "versions": packages, "notes": notes,
        "systems": {s.name: {"family": s.family, "config": s.config,
                             "enqueue_api": s.enqueue_api, "why": s.why} for s in systems},
        "share_of_calls_inside_scripts": {f"{k[0]}/{k[1]}": v
                                          for k, v in harness.inner_share.items()},
        "monitor": harness.monitor_detail,
        "summary": summary, "runs": [asdict(x) for x in runs],
    }, indent=2) + "\n")
    print(f"JSON: {json_path}")
    wurk_runs = [x for x in runs if x.system.startswith("wurk")]
    if not wurk_runs or not all(x.ok and x.lat_complete for x in wurk_runs):
        print("harness: a wurk run failed (see notes)", file=sys.stderr)
        return 1
    return 0


def progress(run: Run) -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "\u2013" if value is None else format(value, spec)
    state = "ok" if run.ok else f"FAILED: {run.error}"
    return (f"  round {run.round} {run.shape:4} {run.system:12} enqueue "
            f"{fmt(run.enqueue_per_s, ',.0f')}/s drain {fmt(run.drain_per_s, ',.0f')}/s "
            f"boot {fmt(run.boot_s, '.2f')}s p50 {fmt(run.lat_p50_ms, '.1f')}ms "
            f"p99 {fmt(run.lat_p99_ms, '.1f')}ms calls/job {fmt(run.calls_per_job, '.2f')} "
            f"RSS {fmt(run.peak_rss_mb, '.0f')}MB x{run.procs}  {state}")


if __name__ == "__main__":
    sys.exit(main())

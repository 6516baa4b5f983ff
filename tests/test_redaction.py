"""No password in any output: every command's error paths that quote a Redis URL.

Each test runs the real command as a subprocess with a password in the URL
(in the userinfo, in ``?password=``, or as ``sentinel_password``) and
asserts that the password appears nowhere in stdout or stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from conftest import RedisServer, free_port, start_redis

from wurk.core import logging as wlog
from wurk.core.redaction import redact_text, redact_url, shown
from wurk.redis.sentinel import SentinelSettings
from wurk.settings.config import Config

REPO = Path(__file__).resolve().parent.parent
SECRET = "Pa55-word-xyzzy"
EX_CONFIG = 78


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WURK_", "REDIS_URL"))}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra})
    return env


def run(*argv: str, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run to completion; returns (status, stdout + stderr)."""
    proc = subprocess.run([sys.executable, "-m", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=40, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def run_for(seconds: float, *argv: str, env: dict[str, str], cwd: Path) -> str:
    """Run for at most ``seconds`` (then TERM, then KILL); returns stdout + stderr.

    For commands that may wait for Redis rather than exit: what they print
    while they wait must be just as clean.
    """
    proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    return out


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    """A redis-server that wants a password other than SECRET."""
    server = start_redis()
    with server.client() as client:
        client.config_set("requirepass", "the-right-one")
    yield server
    server.stop()


BAD_URLS = [
    f"http://app:{SECRET}@127.0.0.1:6379/0",
    f"redis://:{SECRET}@127.0.0.1:99999/0",
    f"redis://app:{SECRET}@127.0.0.1:6379/abc",
    f"rediss://:{SECRET}@127.0.0.1:6380/0?bogus=1",
    f"redis://127.0.0.1:6379/0?password={SECRET}&db=x",
    f"redis://:p/{SECRET}@127.0.0.1:0/0",
]


# -- the one redaction function ---------------------------------------------------

@pytest.mark.parametrize(("url", "expected"), [
    ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
    ("rediss://:pw@host/0", "rediss://:***@host/0"),
    ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
    ("redis://host/0?db=1&ssl_password=pw", "redis://host/0?db=1&ssl_password=***"),
    ("redis://u:p@w/rd@host/0", "redis://u:***@host/0"),
    ("redis://pw@host", "redis://***@host"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
    ("not a url :pw@x", "not a url :***@x"),
])
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_text_and_shown() -> None:
    assert redact_text("failed: redis://:pw@h:1/0 and udp://x:y@m:1 too") == (
        "failed: redis://:***@h:1/0 and udp://x:***@m:1 too")
    assert shown("sentinel_password", "pw") == "***"
    assert shown("redis_url", "redis://:pw@h") == "'redis://:***@h'"
    assert shown("tag", "a@b") == "'a@b'"
    assert shown("typo", ["redis://:pw@h"], unknown=True) == "['redis://:***@h']"


@pytest.mark.parametrize(("text", "expected"), [
    ("to redis://h:1/0?password=s3cret: Error 111", "to redis://h:1/0?password=***: Error 111"),
    ("(at redis://u:pw@h:1/0), then", "(at redis://u:***@h:1/0), then"),
    ("at redis://h/0?token=t.", "at redis://h/0?token=***."),
    ("at 'redis://h/0?auth=a'", "at 'redis://h/0?auth=***'"),
])
def test_redact_text_keeps_the_punctuation_after_a_url(text: str, expected: str) -> None:
    # The mask covers the secret, not the sentence around the URL.
    assert redact_text(text) == expected


# -- wurk run -------------------------------------------------------------------------

@pytest.mark.parametrize("url", BAD_URLS)
def test_wurk_run_config_errors_hide_the_password(tmp_path: Path, url: str) -> None:
    status, out = run("wurk.cli", "run", env=env_with(REDIS_URL=url), cwd=tmp_path)
    assert status == EX_CONFIG, out
    assert SECRET not in out and "***" in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_wurk_run_config_file_and_typo_hide_the_password(tmp_path: Path) -> None:
    for table in (f'redis_url = "ftp://:{SECRET}@h"', f'redis_ur = "redis://:{SECRET}@h"',
                  f'sentinel_password = {{ value = "{SECRET}" }}'):
        (tmp_path / "wurk.toml").write_text(f"[wurk]\n{table}\n")
        status, out = run("wurk.cli", "run", "-C", str(tmp_path / "wurk.toml"),
                          env=env_with(), cwd=tmp_path)
        assert status == EX_CONFIG and SECRET not in out, out


def test_wurk_run_against_a_wrong_password_or_no_server(tmp_path: Path,
                                                        locked_redis: RedisServer) -> None:
    for url in (f"redis://:{SECRET}@127.0.0.1:{locked_redis.port}/0",
                f"redis://app:{SECRET}@127.0.0.1:{free_port()}/0"):
        env = env_with(REDIS_URL=url, WURK_REDIS_CONNECT_TIMEOUT="0.2",
                       WURK_REDIS_RETRY_BASE="0.05", WURK_REDIS_RETRY_CAP="0.2")
        # With a job module: a worker with none would refuse before dialling.
        out = run_for(4, "wurk.cli", "run", "-r", "bench.chaos_jobs", env=env, cwd=tmp_path)
        assert SECRET not in out, out


def test_wurk_run_job_module_errors_hide_a_url_password(tmp_path: Path) -> None:
    (tmp_path / "leaky_jobs.py").write_text(
        f"raise RuntimeError('cannot reach redis://app:{SECRET}@cache:6379/0')\n")
    status, out = run("wurk.cli", "run", "-r", "leaky_jobs",
                      env=env_with(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"), cwd=tmp_path)
    assert status == EX_CONFIG and SECRET not in out and "redis://app:***@cache" in out, out


# -- wurk-swarm -----------------------------------------------------------------------

def topology(tmp_path: Path, url: str, extra: str = "") -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(f'[wurk]\nredis_url = "{url}"\nshutdown_timeout = 1\n{extra}\n'
                    '[[slot]]\nname = "a"\n')
    return path


@pytest.mark.parametrize("url", BAD_URLS)
def test_swarm_check_hides_the_password(tmp_path: Path, url: str) -> None:
    # A run and a probe read the file as --check does; two URLs cover them.
    modes = [["--check"], [], ["--probe"]] if url in BAD_URLS[:2] else [["--check"]]
    for argv in modes:
        status, out = run("supervisor.cli", "-t", str(topology(tmp_path, url)), *argv,
                          env=env_with(), cwd=tmp_path)
        assert status == EX_CONFIG, out
        assert SECRET not in out and "***" in out
        assert len(out.strip().splitlines()) == 1


def test_swarm_slot_url_hides_the_password(tmp_path: Path) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(f'[wurk]\n[[slot]]\nname = "a"\nredis_url = "redis://:{SECRET}@h:70000"\n')
    status, out = run("supervisor.cli", "-t", str(path), "--check", env=env_with(), cwd=tmp_path)
    assert status == EX_CONFIG and SECRET not in out and "slot 'a'" in out, out


def test_swarm_and_probe_against_a_wrong_password(tmp_path: Path,
                                                  locked_redis: RedisServer) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{locked_redis.port}/0"
    path = topology(tmp_path, url, "respawn_backoff_max = 0.1\nboot_failure_limit = 2\n")
    status, out = run("supervisor.cli", "-t", str(path), "--probe", env=env_with(), cwd=tmp_path)
    assert status == 1 and SECRET not in out, out
    out = run_for(8, "supervisor.cli", "-t", str(path), env=env_with(), cwd=tmp_path)
    assert SECRET not in out, out


# -- wurk's admin commands ------------------------------------------------------------

@pytest.mark.parametrize("url", BAD_URLS)
def test_admin_config_errors_hide_the_password(tmp_path: Path, url: str) -> None:
    for argv in (["stats", "--redis-url", url], ["queues"]):
        status, out = run("wurk.cli", *argv, env=env_with(REDIS_URL=url), cwd=tmp_path)
        assert status == EX_CONFIG, out
        assert SECRET not in out and "***" in out


def test_admin_redis_errors_hide_the_password(tmp_path: Path,
                                              locked_redis: RedisServer) -> None:
    for url in (f"redis://app:{SECRET}@127.0.0.1:{locked_redis.port}/0",
                f"redis://127.0.0.1:{locked_redis.port}/0?password={SECRET}",
                f"rediss://:{SECRET}@127.0.0.1:{locked_redis.port}/0",
                f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"):
        started = time.monotonic()
        status, out = run("wurk.cli", "stats", "--redis-url", url, env=env_with(), cwd=tmp_path)
        assert status == 1, out
        assert SECRET not in out and "***" in out
        assert time.monotonic() - started < 20


def test_admin_sentinel_password_stays_hidden(tmp_path: Path) -> None:
    sentinel = f"127.0.0.1:{free_port()}"
    env = env_with(WURK_SENTINELS=sentinel, WURK_SENTINEL_MASTER="m",
                   WURK_SENTINEL_PASSWORD=SECRET, REDIS_URL=f"redis://:{SECRET}@/0")
    status, out = run("wurk.cli", "stats", env=env, cwd=tmp_path)
    assert status == 1 and SECRET not in out, out


def test_sentinel_settings_repr_hides_the_password() -> None:
    config = Config(sentinels=["s1:26379"], sentinel_master="m", sentinel_password=SECRET)
    settings = SentinelSettings.from_config(config)
    assert settings is not None and settings.password == SECRET
    assert SECRET not in repr(settings)


def test_log_lines_never_carry_a_url_password(capfd: pytest.CaptureFixture[str]) -> None:
    saved = structlog.get_config()
    try:
        wlog.setup("info", "json")
        log = wlog.get_logger("test.redaction")
        log.error("redis.down", url=f"redis://app:{SECRET}@h:6379/0",
                  error=f"ConnectionError: while dialing rediss://:{SECRET}@h/0?db=1")
        try:
            raise ValueError(f"bad redis://:{SECRET}@h")
        except ValueError:
            log.exception("boot.crashed")
    finally:
        structlog.configure(**saved)
    err = capfd.readouterr().err
    assert SECRET not in err
    assert "redis://app:***@h:6379/0" in err and "rediss://:***@h/0?db=1" in err
    assert "bad redis://:***@h" in err


def test_library_log_lines_never_carry_a_url_password(tmp_path: Path) -> None:
    # No wurk entry point: events go to the standard logging module.
    script = ("import logging; logging.basicConfig(level=logging.INFO)\n"
              "from wurk.core.logging import get_logger\n"
              f"get_logger('wurk.test').error('redis.down', url='redis://:{SECRET}@h/0')\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env_with(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "redis.down" in proc.stderr and "redis://:***@h/0" in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


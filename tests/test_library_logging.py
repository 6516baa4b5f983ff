"""In a process that only enqueues, wurk prints nothing and picks no format.

Each case runs a real Python subprocess that imports wurk and pushes, the way
a web app or a script does, and reads its stdout and stderr. wurk logs
through the standard ``logging`` module under ``wurk.*`` names with only a
NullHandler of its own, so the application's logging configuration decides
what appears; an entry point (``wurk run``) keeps its own output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import redis
from conftest import RedisServer, free_port

PUSH = """
import wurk
jid = wurk.Client().push({"class": "Mailer", "args": [1]})
"""


def run_python(code: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WURK_")}
    env["REDIS_URL"] = redis_url
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_a_push_prints_nothing(redis_server: RedisServer, r: redis.Redis) -> None:
    done = run_python(PUSH, redis_server.url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert r.llen("queue:default") == 1


def test_a_redis_that_never_answered_is_said_once_as_a_python_warning_not_a_log() -> None:
    # Redis is down: the push is buffered with a push.buffered warning, and
    # the exit flush spools it with a push.spooled error; no log line is
    # printed, but the push that went nowhere is said once through warnings
    # (wurk.PushSpooledWarning, which Python shows by default).
    code = PUSH.replace("wurk.Client()", "wurk.Client(wurk.Config(push_flush_timeout=0.2))")
    done = run_python(code + "wurk.Client().push({'class': 'Mailer', 'args': [2]})\n",
                      f"redis://:pw@127.0.0.1:{free_port()}/0")
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.count("PushSpooledWarning: wurk: Redis at redis://:***@127.0.0.1:") == 1
    assert "push.buffered" not in done.stderr and "push.spooled" not in done.stderr
    assert ":pw@" not in done.stderr


def test_the_warning_filtered_out_leaves_nothing_printed() -> None:
    code = "import warnings, wurk\n" \
           "warnings.simplefilter('ignore', wurk.PushSpooledWarning)\n" + \
           PUSH.replace("wurk.Client()", "wurk.Client(wurk.Config(push_flush_timeout=0.2))")
    done = run_python(code, f"redis://127.0.0.1:{free_port()}/0")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_applications_logging_configuration_decides() -> None:
    code = "import logging, sys\n" \
           "logging.basicConfig(stream=sys.stderr, level=logging.INFO, " \
           "format='%(name)s|%(levelname)s|%(message)s')\n" + \
           PUSH.replace("wurk.Client()", "wurk.Client(wurk.Config(push_flush_timeout=0.2))")
    done = run_python(code, f"redis://127.0.0.1:{free_port()}/0")
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    buffered = [line for line in lines if "push.buffered" in line]
    assert buffered and buffered[0].startswith("wurk.push|WARNING|push.buffered ")
    assert any(line.startswith("wurk.push|ERROR|push.spooled ") for line in lines)


def test_an_application_that_silences_wurk_hears_only_the_python_warning() -> None:
    code = "import logging\nlogging.basicConfig(level=logging.INFO)\n" \
           "logging.getLogger('wurk').setLevel(logging.CRITICAL)\n" + \
           PUSH.replace("wurk.Client()", "wurk.Client(wurk.Config(push_flush_timeout=0.2))")
    done = run_python(code, f"redis://127.0.0.1:{free_port()}/0")
    # Only the Python warning, which logging levels do not govern.
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len([line for line in lines if "PushSpooledWarning" in line]) == 1, lines
    # Past the warning (and the source line Python may echo under it), nothing.
    assert all("PushSpooledWarning" in line or line.startswith("  ") for line in lines), lines

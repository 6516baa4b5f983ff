"""Destructive admin commands ask first: on a terminal a y/N question,
anywhere else they need ``--yes`` (exit 2 and nothing touched without it).

The terminal cases run the real ``wurk`` command with its stdin on a
pseudo-terminal and answer the question through it.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from conftest import RedisServer

ENTRY = '{"class":"WurkEcho","args":[1],"jid":"%s","queue":"default","retry_count":1}'
DESTROYERS = [["retries", "clear"], ["retries", "clear", "--all"],
              ["retries", "delete", "a"], ["retries", "delete", "--all"]]


def fill(r: redis.Redis) -> None:
    r.zadd("retry", {ENTRY % "a": time.time() + 60, ENTRY % "b": time.time() + 90})


def wurk(redis_server: RedisServer, *argv: str, answer: str | None = None) -> tuple[int, str]:
    """Run ``wurk ARGV``; with ``answer``, stdin is a terminal that types it."""
    command = [str(Path(sys.executable).with_name("wurk")), "--redis-url", redis_server.url,
               *argv]
    if answer is None:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=30, check=False)
        return done.returncode, done.stderr
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdin=follower, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        os.write(leader, answer.encode())
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    return proc.returncode, err


@pytest.mark.parametrize("argv", DESTROYERS, ids=" ".join)
def test_without_a_terminal_destroying_needs_yes(redis_server: RedisServer, r: redis.Redis,
                                                 argv: list[str]) -> None:
    fill(r)
    code, err = wurk(redis_server, *argv)
    assert code == 2 and "--yes" in err and r.zcard("retry") == 2
    code, err = wurk(redis_server, *argv, "--yes")
    assert code == 0, err
    assert r.zcard("retry") == (1 if argv[-1] == "a" else 0)


@pytest.mark.parametrize("argv", DESTROYERS, ids=" ".join)
def test_on_a_terminal_destroying_asks(redis_server: RedisServer, r: redis.Redis,
                                       argv: list[str]) -> None:
    fill(r)
    code, err = wurk(redis_server, *argv, answer="n\n")
    assert code == 1 and "[y/N]" in err and "nothing was changed" in err
    assert r.zcard("retry") == 2
    code, err = wurk(redis_server, *argv, answer="y\n")
    assert code == 0, err
    assert r.zcard("retry") == (1 if argv[-1] == "a" else 0)


def test_listing_and_retrying_never_ask(redis_server: RedisServer, r: redis.Redis) -> None:
    fill(r)
    assert wurk(redis_server, "retries", "list")[0] == 0
    assert wurk(redis_server, "retries", "retry", "a")[0] == 0
    assert r.zcard("retry") == 1 and r.llen("queue:default") == 1

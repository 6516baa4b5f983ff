"""Cancelling a job that waits (wurk.api.cancel, ``wurk cancel JID``): a queued,
scheduled or retrying job is removed through the removal script, its unique
lock released and its result waiter told JobCancelled; an unknown jid says so.
Real redis-server; the CLI through its own entry point."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import admin_cli
import pytest
import redis
from admin_cli import Cli

import wurk
from wurk.api import JobNotFoundError, cancel
from wurk.push.client import Client
from wurk.results.client import Outcome, wait
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire import keys

cli = admin_cli.cli
keep_logging = admin_cli.keep_logging


def push(config: Config, n: int, **extra: Any) -> str:
    jid = Client(config).push({"class": "Feed", "args": [n], "unique_for": 3600,
                               "result_ttl": 60, **extra})
    assert jid is not None
    return jid


def waiter(jid: str, config: Config) -> tuple[threading.Thread, list[Outcome]]:
    got: list[Outcome] = []
    thread = threading.Thread(target=lambda: got.append(wait(jid, 30, config=config)))
    thread.start()
    return thread, got


def told_cancelled(thread: threading.Thread, got: list[Outcome]) -> str:
    thread.join(30)
    [outcome] = got
    assert (outcome.status, outcome.error_class, outcome.final) == (
        "failed", "JobCancelled", True)
    return outcome.error_message


def test_a_queued_job_is_removed_with_its_lock_and_its_waiter_told(
        config: Config, r: redis.Redis) -> None:
    jid, other = push(config, 1), push(config, 2)
    thread, got = waiter(jid, config)
    found = cancel(jid, config=config)
    assert (found.state, found.where) == ("queued", "default")
    assert "cancelled by a person from queue 'default'" in told_cancelled(thread, got)
    assert [json.loads(raw)["jid"] for raw in r.lrange("queue:default", 0, -1)] == [other]
    assert not r.exists(lock_key("Feed", "default", [1]))
    assert r.exists(lock_key("Feed", "default", [2]))
    assert not r.exists(keys.cancel(jid))  # it never runs: no marker left behind


@pytest.mark.parametrize(("source", "state"), [(keys.SCHEDULE, "scheduled"),
                                               (keys.RETRY, "retry")])
def test_a_scheduled_or_retrying_job_never_runs(config: Config, r: redis.Redis,
                                                source: str, state: str) -> None:
    jid = push(config, 1, at=time.time() + 600)
    if source == keys.RETRY:
        [member] = r.zrange(keys.SCHEDULE, 0, -1)
        r.delete(keys.SCHEDULE)
        r.zadd(keys.RETRY, {member: time.time() + 600})
    thread, got = waiter(jid, config)
    assert cancel(jid, config=config).state == state
    told_cancelled(thread, got)
    assert r.zcard(source) == 0 and r.zcard(keys.DEAD) == 0
    assert not r.exists(lock_key("Feed", "default", [1]))


def test_an_unknown_jid_raises_and_the_cli_says_so_in_one_line(config: Config,
                                                                 cli: Cli) -> None:
    with pytest.raises(JobNotFoundError):
        cancel("0123456789abcdef01234567", config=config)
    result = cli("cancel", "0123456789abcdef01234567")
    assert result.code == 1 and result.out == ""
    assert result.err.splitlines() == [
        "wurk: no job with jid '0123456789abcdef01234567' in the queues, the schedule, "
        "the retry set or the running jobs"]


def test_the_cli_cancels_a_queued_job_and_says_where_it_was(config: Config, cli: Cli,
                                                            r: redis.Redis) -> None:
    jid = push(config, 1)
    result = cli("cancel", jid)
    assert result.code == 0
    assert result.lines == [f"{jid}: cancelled: removed from queue 'default'; it will not run"]
    assert r.llen("queue:default") == 0
    jid = push(config, 2)
    assert cli("--json", "cancel", jid).json == {"jid": jid, "state": "queued",
                                                  "where": "default"}


def test_job_cancelled_is_exported_and_no_exception() -> None:
    assert issubclass(wurk.JobCancelled, BaseException)
    assert not issubclass(wurk.JobCancelled, Exception)

"""``wurk retries|dead|scheduled show JID``: one failure, everything about it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from admin_cli import Cli, cli  # noqa: F401 - the fixture
from waiting import wait_for

from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config


def explode(order: str, cents: int) -> None:
    raise ValueError(f"card declined for {order}")


def test_show_prints_the_error_backtrace_args_and_retry_fields(
        cli: Cli, config: Config, r: redis.Redis,  # noqa: F811
        define: Callable[..., JobFunction[..., Any]],
        launch: Callable[..., Launcher]) -> None:
    job = define(explode, backtrace=True, retry=3)
    jid = job.perform_async("order-7", 1999)
    launch()
    wait_for(lambda: r.zcard("retry") == 1, what="the failure recorded")

    [entry] = cli("retries", "show", jid, "--json").json["entries"]
    assert (entry["jid"], entry["class"], entry["args"]) == (jid, job.name, ["order-7", 1999])
    assert (entry["error_class"], entry["error_message"]) == ("ValueError",
                                                              "card declined for order-7")
    assert (entry["retry"], entry["retry_count"]) == (3, 0)
    assert entry["failed_at"] > time.time() - 60 and entry["retried_at"] is None
    assert any("in `explode'" in line for line in entry["error_backtrace"])

    text = cli("retries", "show", jid).out
    assert "error: ValueError: card declined for order-7" in text
    assert 'args: ["order-7", 1999]' in text and "retry_count: 0" in text
    assert "backtrace:" in text and "in `explode'" in text


def test_show_without_a_stored_backtrace_says_so(cli: Cli, r: redis.Redis) -> None:  # noqa: F811
    r.zadd("dead", {'{"class":"X","args":[1],"jid":"j1","queue":"q","error_class":"E",'
                    '"error_message":"m","retry_count":25}': time.time()})
    text = cli("dead", "show", "j1").out
    assert "error: E: m" in text and "backtrace: none stored" in text
    assert cli("dead", "show", "nope").code == 1
    assert cli("dead", "show").code == 2

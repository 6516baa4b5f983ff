"""Recycling by count (``max_jobs``): the limit a process draws, the budget that
counts its jobs, the settings' checks, and a real ``wurk run`` that exits 75
after its jobs (the swarm's replacements: tests/test_swarm_recycle.py).
"""

from __future__ import annotations

import collections
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
from cli_workers import Worker
from draws import FixedRng
from tuning import tuned
from waiting import wait_for

from supervisor.topology import TopologyError, parse
from wurk.cli import EX_RECYCLED
from wurk.runtime.launcher import MAX_JOBS, Launcher
from wurk.runtime.recycling import JobBudget, job_limit
from wurk.settings.config import Config, ConfigError

pytestmark = pytest.mark.timeout(90)

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir


# -- the decision -------------------------------------------------------------------

def test_the_limit_is_max_jobs_plus_a_uniform_draw_up_to_the_jitter() -> None:
    assert job_limit(None, None, FixedRng(0.5)) is None
    assert job_limit(None, 50, FixedRng(0.5)) is None
    # Each of 0..jitter is equally likely: the draw's range cut in jitter + 1 parts.
    assert job_limit(100, 10, FixedRng(0.0)) == 100
    assert job_limit(100, 10, FixedRng(0.5)) == 105
    assert job_limit(100, 10, FixedRng(0.999999)) == 110
    assert job_limit(100, 0, FixedRng(0.999999)) == 100
    # Unset, the jitter is a tenth of max_jobs (rounded down).
    assert job_limit(1000, None, FixedRng(0.999999)) == 1100
    assert job_limit(1000, None, FixedRng(0.0)) == 1000
    assert job_limit(5, None, FixedRng(0.999999)) == 5


def test_children_draw_limits_spread_over_the_jitter() -> None:
    rng = random.Random(7)
    drawn = collections.Counter(job_limit(100, 4, rng) for _ in range(5000))
    assert set(drawn) == {100, 101, 102, 103, 104}
    assert min(drawn.values()) > 800  # about 1000 each


def test_the_budget_calls_once_from_the_job_that_reaches_the_limit() -> None:
    calls: list[str] = []
    budget = JobBudget(50, lambda: calls.append(threading.current_thread().name))
    threads = [threading.Thread(target=lambda: [budget.spend() for _ in range(20)],
                                name=f"t{i}") for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert budget.spent == 100
    assert len(calls) == 1


def test_a_budget_whose_callback_fails_logs_and_does_not_raise() -> None:
    def broken() -> None:
        raise OSError("no pipe")

    budget = JobBudget(1, broken)
    budget.spend()  # must not raise into the settling job
    budget.spend()


# -- the settings -------------------------------------------------------------------

BAD_VALUES: list[tuple[str, Any]] = [
    ("0", 0), ("-5", -5), ("true", True), ('"10"', "10"), ("1.5", 1.5)]


@pytest.mark.parametrize(("text", "value"), BAD_VALUES, ids=[t for t, _ in BAD_VALUES])
def test_a_bad_max_jobs_in_a_slot_or_wurk_table_is_a_one_line_error(
        tmp_path: Path, text: str, value: Any) -> None:
    path = tmp_path / "swarm.toml"
    for document in ({"slot": [{"name": "web", "max_jobs": value}]},
                     {"wurk": {"max_jobs": value}, "slot": [{"name": "web"}]}):
        with pytest.raises(TopologyError) as error:
            parse(document, path, env={})
        message = str(error.value)
        assert "\n" not in message and "max_jobs" in message and str(path) in message
        assert "web" in message or "[wurk]" in message
    with pytest.raises(TopologyError, match="max_jobs_jitter"):
        parse({"slot": [{"name": "web", "max_jobs": 10, "max_jobs_jitter": -1}]}, path, env={})


def test_a_slot_sets_its_own_max_jobs_over_the_wurk_tables(tmp_path: Path) -> None:
    topology = parse({"wurk": {"max_jobs": 500},
                      "slot": [{"name": "a"}, {"name": "b", "max_jobs": 20,
                                               "max_jobs_jitter": 0}]},
                     tmp_path / "swarm.toml", env={})
    a, b = topology.slots
    assert (a.config.max_jobs, a.config.max_jobs_jitter) == (500, None)
    assert (b.config.max_jobs, b.config.max_jobs_jitter) == (20, 0)


def test_wurk_run_takes_max_jobs_as_a_keyword_and_checks_it() -> None:
    assert Config.load(None, max_jobs=7).max_jobs == 7
    with pytest.raises(ConfigError, match="max_jobs"):
        Config.load(None, max_jobs=0)
    for bad in (True, "10", -1):
        with pytest.raises(ConfigError, match="max_jobs"):
            Config.load(None, max_jobs=bad)


def test_the_environment_sets_max_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WURK_MAX_JOBS", "250")
    monkeypatch.setenv("WURK_MAX_JOBS_JITTER", "0")
    config = Config.load(None)
    assert (config.max_jobs, config.max_jobs_jitter) == (250, 0)
    monkeypatch.setenv("WURK_MAX_JOBS", "0")
    with pytest.raises(ConfigError, match="WURK_MAX_JOBS"):
        Config.load(None)


# -- one process --------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["threads", "asyncio"])
def test_a_launcher_asks_its_owner_to_stop_once_after_its_jobs(
        config: Config, define: Callable[..., Any],
        launch: Callable[..., Launcher], r: redis.Redis, executor: str) -> None:
    config = tuned(config, max_jobs=3, max_jobs_jitter=0, concurrency=1, executor=executor)
    asked = threading.Event()
    stops: list[int] = []

    def ran(n: int) -> None:
        r.rpush("ran", n)

    async def ran_async(n: int) -> None:
        r.rpush("ran", n)

    job = define(ran if executor == "threads" else ran_async)
    for n in range(6):
        job.perform_async(n)

    def stop_request() -> None:
        stops.append(int(r.llen("ran")))
        asked.set()

    launcher = launch(on_stop_request=stop_request)
    assert asked.wait(20)
    assert launcher.recycled == MAX_JOBS and not launcher.overran.is_set()
    assert launcher.manager.quieting  # fetching stopped before the owner was asked
    launcher.stop()
    assert stops == [3] and r.llen("ran") == 3 and r.llen("queue:default") == 3


def test_an_embedded_style_launcher_counts_nothing(
        config: Config, define: Callable[..., Any],
        launch: Callable[..., Launcher], r: redis.Redis) -> None:
    config = tuned(config, max_jobs=1, max_jobs_jitter=0)
    job = define(lambda n: r.rpush("ran", n))
    launcher = launch(recycle=False)
    for n in range(3):
        job.perform_async(n)
    wait_for(lambda: r.llen("ran") == 3)
    assert launcher.recycled is None and launcher.manager.counters.on_record is None


def test_wurk_run_exits_75_after_its_max_jobs(
        spawn: Callable[..., Worker], r: redis.Redis) -> None:
    for n in range(10):
        cli_workers.push(r, "cli_echo", n)
    worker = spawn("-r", "clijobs", "-c", "1", "--max-jobs", "4", "--log-level", "info",
                   WURK_MAX_JOBS_JITTER="0")
    assert worker.wait(40) == EX_RECYCLED
    recycled = [e for e in worker.events() if e.get("event") == "launcher.recycling"]
    assert [(e["reason"], e["jobs"]) for e in recycled] == [("max_jobs", 4)]
    # One thread: it stopped fetching as its 4th job ended.
    assert r.llen("cli:done") == 4 and r.llen("queue:default") == 6
    assert r.scard("processes") == 0

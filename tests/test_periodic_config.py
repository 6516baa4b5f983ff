"""Declaring periodic entries (code and topology), and reading and steering them
(wurk.api, ``wurk periodic``)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import admin_cli
import pytest
import redis

from supervisor.topology import TopologyError, parse
from wurk.api.periodic import PeriodicSet, UnknownPeriodicError
from wurk.push.cron import Schedule
from wurk.push.periodic import PeriodicError, PeriodicTable, make_entry, periodic, table
from wurk.redis.runtime import runtime_for
from wurk.runtime.periodic_guard import register
from wurk.settings.config import Config

HERE = Path("topology.toml")
keep_logging = admin_cli.keep_logging
cli = admin_cli.cli


# -- declaring in code -----------------------------------------------------------

@pytest.mark.parametrize(("name", "fields"), [
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"), ("  */5  * * * * ", "*/5 * * * *")])
def test_cron_names_and_fields(name: str, fields: str) -> None:
    assert Schedule(name).fields == fields


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"schedule": "61 * * * *"}, "cron schedule '61 * * * *'"),
    ({"schedule": "* * * *"}, "needs 5 fields"),
    ({"schedule": "0 0 * * * *"}, "needs 5 fields"),
    ({"schedule": "@reboot"}, "unknown cron name '@reboot'"),
    ({"schedule": ""}, "non-empty string"),
    ({"schedule": 5}, "non-empty string"),
    ({"tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ({"tz": "../../etc/passwd"}, "unknown time zone"),
    ({"args": "x"}, "args must be a list"),
    ({"args": [object()]}, "args must be JSON"),
    ({"args": [datetime.datetime(2026, 1, 1)]}, "args must be JSON"),
    ({"queue": ""}, "queue must be a non-empty string"),
    ({"retry": -1}, "retry must be"),
    ({"missed": "all"}, "missed must be 'once' or 'skip'"),
    ({"paused": "yes"}, "paused must be true or false"),
    ({"name": "has space"}, "name must be"),
])
def test_bad_declarations_name_the_entry_and_the_value(kwargs: dict[str, Any],
                                                       message: str) -> None:
    given = {"schedule": "* * * * *", "job": "Report", "name": "report", **kwargs}
    with pytest.raises(PeriodicError) as info:
        make_entry(given.pop("schedule"), given.pop("job"), **given)
    assert "periodic entry 'report'" in str(info.value) or "name must" in str(info.value)
    assert message in str(info.value)


def test_a_job_object_gives_its_name_queue_and_retry(define: Any) -> None:
    mailer = define(lambda to: None, queue="mail", retry=3)
    entry = make_entry("@daily", mailer, args=["x"], tz="Europe/Paris")
    assert (entry.name, entry.job, entry.queue, entry.retry) == (mailer.name, mailer.name,
                                                                 "mail", 3)
    payload = entry.tick_payload(1_800_000_000)
    assert payload == {"class": mailer.name, "args": ["x"], "queue": "mail", "retry": 3,
                       "periodic": {"name": mailer.name, "tick": 1_800_000_000}}
    assert make_entry("@daily", mailer, queue="other", retry=False).queue == "other"


def test_the_process_table_refuses_a_different_entry_under_a_taken_name() -> None:
    try:
        first = periodic("*/5 * * * *", "Report", args=[1])
        assert periodic("*/5 * * * *", "Report", args=[1]) == first  # the same again: fine
        with pytest.raises(PeriodicError, match="already declared differently"):
            periodic("*/10 * * * *", "Report")
        assert periodic("*/10 * * * *", "Report", name="report-10").name == "report-10"
        assert [e.name for e in table.entries()] == ["Report", "report-10"]
    finally:
        table.clear()
    assert PeriodicTable().entries() == []


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)


def test_import_wurk_does_not_import_the_cron_library() -> None:
    done = run_python("import sys, wurk; wurk.periodic; print('cronsim' in sys.modules)")
    assert done.stdout.strip() == "False", done.stderr


def test_without_the_extra_a_declaration_says_which_to_install() -> None:
    done = run_python("import sys; sys.modules['cronsim'] = None\n"
                      "import wurk\n"
                      "try:\n    wurk.periodic('@daily', 'Report')\n"
                      "except wurk.PeriodicError as e:\n    print(e)")
    assert "pip install 'wurk[periodic]'" in done.stdout, done.stderr


# -- the topology file ---------------------------------------------------------

def document(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"wurk": {"redis_url": "redis://127.0.0.1:6390/0"},
            "slot": [{"name": "a"}], "periodic": list(entries)}


def test_periodic_tables_in_the_topology() -> None:
    topology = parse(document(
        {"schedule": "*/5 * * * *", "job": "Report", "args": ["daily", 2], "tz": "Europe/Paris"},
        {"name": "nightly", "schedule": "@daily", "job": "Report", "queue": "low",
         "missed": "skip", "retry": 2, "paused": True}), HERE)
    first, second = topology.periodic
    assert (first.name, first.args, first.schedule.tz) == ("Report", ("daily", 2), "Europe/Paris")
    assert (second.name, second.queue, second.missed, second.retry, second.paused) == (
        "nightly", "low", "skip", 2, True)
    assert parse({"slot": [{"name": "a"}]}, HERE).periodic == ()


@pytest.mark.parametrize(("entry", "message"), [
    ({"schedule": "* * *", "job": "R"}, "periodic[0] ('R'): periodic entry 'R': cron schedule"),
    ({"schedule": "@daily", "job": "R", "tz": "Nowhere/Land"}, "unknown time zone"),
    ({"schedule": "@daily", "job": 5}, "periodic[0]: job must be a non-empty string, got 5"),
    ({"schedule": "@daily"}, "job must be a non-empty string, got None"),
    ({"job": "R"}, "periodic[0] ('R'): schedule must be a non-empty string"),
    ({"schedule": "@daily", "job": "R", "args": "x"}, "args must be a list"),
    ({"schedule": "@daily", "job": "R", "args": [datetime.date(2026, 1, 1)]},
     "args must be JSON"),
    ({"schedule": "@daily", "job": "R", "every": 5}, "unknown key 'every'"),
    ({"schedule": "@daily", "job": "R", "name": "x y"}, "name must be"),
])
def test_bad_periodic_tables_are_named(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse(document(entry), HERE)
    text = str(info.value)
    assert text.startswith(str(HERE)) and message in text, text


def test_two_periodic_tables_with_one_name() -> None:
    with pytest.raises(TopologyError, match="periodic name 'R' is used by more than one"):
        parse(document({"schedule": "@daily", "job": "R"}, {"schedule": "@hourly", "job": "R"}),
              HERE)
    with pytest.raises(TopologyError, match=r"periodic must be \[\[periodic\]\] tables"):
        parse({**document(), "periodic": {"schedule": "@daily"}}, HERE)


# -- wurk.api and the admin CLI ------------------------------------------------

def registered(config: Config, *entries: Any, now: float = 1_800_000_000) -> None:
    register(runtime_for(config).pool, list(entries), now)


def test_the_api_reads_garbage_without_failing(config: Config, r: redis.Redis) -> None:
    r.sadd("periodic", "junk", "gone", "ruby-lid")
    r.hset("loops:junk", mapping={"schedule": "not cron", "tz": "Nowhere", "options": "{bad",
                                  "tick": "abc", "lf": "-5", "paused": "maybe"})
    r.hset("loops:ruby-lid", mapping={"schedule": "0 4 * * *", "klass": "NightlyJob",
                                      "options": json.dumps({"queue": "low", "args": [1]}),
                                      "tz": "", "paused": "0", "lf": "1800000000"})
    r.lpush("loop-history:ruby-lid", "[1800000000,\"abc\"]", "garbage", "[1]")
    api = PeriodicSet(config)
    junk, ruby = api.all(now=1_800_000_000)
    assert (junk.name, junk.next_run, junk.last_tick, junk.last_fired_at, junk.args) == (
        "junk", None, None, None, [])
    assert (ruby.job, ruby.queue, ruby.args, ruby.tz) == ("NightlyJob", "low", [1], "UTC")
    assert ruby.next_run == 1_800_000_000 - 1_800_000_000 % 86400 + 86400 + 4 * 3600
    assert [(x.fired_at, x.jid) for x in api.history("ruby-lid")] == [(1_800_000_000, "abc")]
    with pytest.raises(UnknownPeriodicError, match="no periodic entry named 'gone'"):
        api.fetch("gone")


def test_wurk_periodic_list_pause_unpause_history(cli: admin_cli.Cli, config: Config,
                                                  r: redis.Redis) -> None:
    registered(config, make_entry("*/5 * * * *", "Report", tz="Europe/Paris", args=[1]))
    listed = cli("periodic", "--json").json["periodic"]
    assert [(p["name"], p["schedule"], p["tz"], p["job"], p["paused"]) for p in listed] == [
        ("Report", "*/5 * * * *", "Europe/Paris", "Report", False)]
    assert listed[0]["next_run"] % 300 == 0
    assert cli("periodic", "pause", "Report", "--json").json == {"name": "Report",
                                                                  "paused": True}
    assert r.hget("loops:Report", "paused") == "1"
    human = cli("periodic").lines
    assert human[0].split()[:8] == ["NAME", "SCHEDULE", "TZ", "JOB", "QUEUE", "STATE", "LAST",
                                    "NEXT"]
    assert "paused" in human[1]
    assert cli("periodic", "unpause", "Report").out.strip() == "Report: unpaused"
    r.lpush("loop-history:Report", "[1800000000,\"j1\"]")
    shown = cli("periodic", "history", "Report", "--json").json
    assert shown["history"] == [{"fired_at": 1_800_000_000, "jid": "j1"}]
    assert len(shown["next_runs"]) == 5
    assert "j1" in cli("periodic", "history", "Report").out


def test_wurk_periodic_errors(cli: admin_cli.Cli) -> None:
    missing = cli("periodic", "pause", "nope")
    assert missing.code == 1 and "no periodic entry named 'nope'" in missing.err
    assert cli("periodic", "pause").code == 2
    assert cli("periodic", "list", "extra").code == 2
    assert "no periodic entries" in cli("periodic").out


def test_due_after_a_long_outage_does_not_walk_every_tick() -> None:
    every_minute = Schedule("* * * * *")
    now = 1_800_000_000 + 17
    first, latest = every_minute.due(now - 3 * 86400, now) or (0, 0)
    assert (first, latest) == (now - 3 * 86400 - 17 + 60, now - 17)
    assert every_minute.due(now - 10, now) is None


def test_next_after_from_inside_a_repeated_hour_skips_its_first_occurrence() -> None:
    nightly = Schedule("30 1 * * *", "America/New_York")
    second_0110 = int(datetime.datetime(2026, 11, 1, 6, 10, tzinfo=datetime.UTC).timestamp())
    following = nightly.next_after(second_0110)
    assert following == int(datetime.datetime(2026, 11, 2, 6, 30,
                                               tzinfo=datetime.UTC).timestamp())

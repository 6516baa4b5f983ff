"""The dashboard on data Ruby Sidekiq 6.4 wrote, acted on, and run again by Ruby.

Real Ruby writes every kind of entry (tests/interop/webdata.rb): jobs a
Ruby app and a Rails app (ActiveJob, a mailer) push, a ``display_class``
payload, scheduled jobs, retry entries and dead entries that a live Ruby
``sidekiq`` failed itself, and a dead entry from ``Sidekiq::DeadSet#kill``.
The tests read them through the dashboard's HTTP layer, compare what it
shows with what Sidekiq's own API (tests/interop/api.rb) says, act on them
from the dashboard, check the move in Redis (the exact member Ruby wrote
left its set once, nothing duplicated), and wait for the live Ruby server
to run the moved job.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
import test_interop_support
from markupsafe import escape
from starlette.testclient import TestClient
from test_interop_support import (
    ARGS,
    RUBY_RUNS,
    RubySidekiq,
    assert_exact,
    list_items,
    run_ruby,
    runs,
    wait_run,
    zset_members,
)
from waiting import wait_for
from webstack import BIN, chromium

import wurk.web
from wurk.settings.config import Config

redis_server = test_interop_support.module_redis_server
ruby = test_interop_support.module_ruby

HELD = "rb-held"  # a queue no Ruby server works: its jobs stay for the pages


@pytest.fixture
def web(config: Config, ruby: RubySidekiq, r: redis.Redis) -> Iterator[TestClient]:
    ruby.wait_registered(r)  # ``r`` flushed Redis: the Ruby server is back once it beats
    with TestClient(wurk.web.app(config)) as client:
        yield client


def ruby_data(config: Config, *argv: str) -> dict[str, str]:
    written: dict[str, str] = run_ruby(config.redis_url, "webdata.rb", *argv)
    return written


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


def key_of(page: str, jid: str) -> str:
    found = re.search(rf'name="key" value="([^"]+-{jid})"', page)
    assert found, f"no entry {jid} on the page"
    return html.unescape(found.group(1))


def member_of(r: redis.Redis, key: str, jid: str) -> str:
    """The exact member Ruby wrote for ``jid``."""
    found = [m for m in zset_members(r, key) if json.loads(m)["jid"] == jid]
    assert len(found) == 1, found
    return found[0]


def shown(value: str) -> str:
    """A string argument as a page shows it: JSON-quoted, HTML-escaped."""
    return str(escape(json.dumps(value, ensure_ascii=False)))


def ruby_records(config: Config) -> dict[str, dict[str, Any]]:
    """Every job Sidekiq's own API sees, by jid, with its display_class/args."""
    dump = run_ruby(config.redis_url, "api.rb", "dump")
    records = [job for q in dump["queues"] for job in q["jobs"]]
    records += dump["retry"] + dump["scheduled"] + dump["dead"]
    return {record["jid"]: record for record in records}


def assert_shown_as_ruby(page: str, record: dict[str, Any]) -> None:
    """The page shows Ruby's display class and every plain-text argument it shows."""
    assert str(escape(record["display_class"])) in page, record["display_class"]
    for arg in record["display_args"] or []:
        if isinstance(arg, str):
            assert shown(arg) in page, arg


def fail_in_ruby(config: Config, r: redis.Redis, how: str, count: int, into: str) -> dict[str, str]:
    jids = ruby_data(config, how, str(count))
    wait_for(lambda: {str(json.loads(m)["jid"]) for m in zset_members(r, into)}
             >= set(jids.values()), what=f"Ruby failing {count} jobs into {into}")
    return jids


def test_every_page_shows_ruby_jobs_as_sidekiq_does(config: Config, web: TestClient,
                                                    r: redis.Redis) -> None:
    held = ruby_data(config, "held", HELD)
    scheduled = ruby_data(config, "scheduled")
    retrying = fail_in_ruby(config, r, "failing", 1, "retry")
    dying = fail_in_ruby(config, r, "dying", 1, "dead")
    killed = ruby_data(config, "kill")
    records = ruby_records(config)
    assert records[held["activejob"]]["display_class"] == "WelcomeJob"
    assert records[held["mailer"]]["display_class"] == "UserMailer#welcome"
    assert records[held["shown"]]["display_class"] == "Shown::AsThis"

    queue = web.get(f"/queues/{HELD}").text
    for jid in held.values():
        assert jid in queue
        assert_shown_as_ruby(queue, records[jid])
    assert "_aj_symbol_keys" not in queue and "_aj_ruby2_keywords" not in queue
    assert "gid://shop/User/42" in queue  # the record a person knows, not the wrapper hash
    assert HELD in web.get("/queues").text

    pages = {"scheduled": scheduled, "retries": retrying, "dead": {**dying, **killed}}
    for slug, jids in pages.items():
        listing = web.get(f"/{slug}").text
        for jid in jids.values():
            assert_shown_as_ruby(listing, records[jid])
            entry = web.get(f"/{slug}/{quote(key_of(listing, jid), safe='')}")
            assert entry.status_code == 200 and jid in entry.text
            assert_shown_as_ruby(entry.text, records[jid])
    retry_entry = open_entry(web, "retries", retrying["RbFlakyLater1"])
    assert "flaky failure on attempt 1" in retry_entry and "RuntimeError" in retry_entry
    trace = retry_entry.split('<pre class="backtrace">')[1].split("</pre>")[0]
    assert len(trace.splitlines()) == 5 and "worker.rb" in trace  # Ruby's zlib+base64 form
    assert "killed from Ruby" in web.get("/dead").text


@pytest.mark.parametrize(("slug", "how"), [("scheduled", "scheduled"), ("dead", "kill")])
def test_search_finds_ruby_entries_by_class_jid_and_argument(
        config: Config, web: TestClient, r: redis.Redis, slug: str, how: str) -> None:
    jids = ruby_data(config, how)
    if how == "scheduled":
        ruby_data(config, "dying", "1")  # something else in the morgue... and none here
    activejob = jids.get("activejob") or jids["killed"]
    for query in ("WelcomeJob", activejob, "aj-needle", "gid://shop/User/42"):
        page = web.get(f"/{slug}", params={"q": query}).text
        assert activejob in page and "1 match " in page, query
    if how == "scheduled":
        page = web.get("/scheduled", params={"q": "mail-needle"}).text
        assert jids["mailer"] in page and "UserMailer#welcome" in page
        page = web.get("/scheduled", params={"q": "RbEcho"}).text
        assert "2 matches" in page and jids["plain"] in page and jids["shown"] in page
    assert "No job matches." in web.get(f"/{slug}", params={"q": "no-such-thing"}).text


def test_queue_delete_one_and_clear_on_ruby_jobs(config: Config, web: TestClient,
                                                 r: redis.Redis) -> None:
    held = ruby_data(config, "held", HELD)
    before = list_items(r, f"queue:{HELD}")
    page = web.get(f"/queues/{HELD}").text
    index = next(i for i, raw in enumerate(before) if json.loads(raw)["jid"] == held["mailer"])
    reply = web.post(f"/queues/{HELD}/delete", data={"csrf": csrf(page), "index": index,
                                                    "jid": held["mailer"], "page": 1})
    assert "deleted" in str(reply.url)
    assert list_items(r, f"queue:{HELD}") == [raw for i, raw in enumerate(before) if i != index]
    sidekiq_sees = run_ruby(config.redis_url, "api.rb", "dump")["queues"]
    assert [len(q["jobs"]) for q in sidekiq_sees if q["name"] == HELD] == [3]

    web.post(f"/queues/{HELD}/clear", data={"csrf": csrf(page), "confirm": HELD})
    assert r.exists(f"queue:{HELD}") == 0 and not r.sismember("queues", HELD)
    assert HELD not in [q["name"] for q in run_ruby(config.redis_url, "api.rb", "dump")["queues"]]


def open_entry(web: TestClient, slug: str, jid: str) -> str:
    key = quote(key_of(web.get(f"/{slug}").text, jid), safe="")
    reply = web.get(f"/{slug}/{key}")
    assert reply.status_code == 200, reply.text[-1000:]
    return reply.text


def act(web: TestClient, slug: str, jid: str, verb: str) -> None:
    page = web.get(f"/{slug}").text
    key = quote(key_of(page, jid), safe="")
    reply = web.post(f"/{slug}/{key}", data={"csrf": csrf(page), "action": verb})
    assert f"done={verb}" in str(reply.url) and "n=1" in str(reply.url), reply.url


def ran_once(r: redis.Redis, jid: str, **expected: Any) -> dict[str, Any]:
    run = wait_run(r, RUBY_RUNS, jid)[0]
    for name, value in expected.items():
        assert run[name] == value, name
    return run


def test_one_entry_actions_move_ruby_entries_and_ruby_runs_them(
        config: Config, web: TestClient, r: redis.Redis) -> None:
    scheduled = ruby_data(config, "scheduled")
    before = {jid: member_of(r, "schedule", jid) for jid in scheduled.values()}

    act(web, "scheduled", scheduled["activejob"], "add")
    run = ran_once(r, scheduled["activejob"],
                   **{"class": "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"})
    original = json.loads(before[scheduled["activejob"]])
    assert run["args"] == original["args"] and run["job"]["wrapped"] == "WelcomeJob"
    assert run["job"]["created_at"] == original["created_at"]  # Ruby's float, read back alike
    assert "at" not in run["job"]
    act(web, "scheduled", scheduled["mailer"], "add")
    assert ran_once(r, scheduled["mailer"])["args"][0]["arguments"][:2] == ["UserMailer", "welcome"]
    act(web, "scheduled", scheduled["plain"], "delete")
    act(web, "scheduled", scheduled["shown"], "kill")
    assert r.zcard("schedule") == 0
    assert zset_members(r, "dead") == [before[scheduled["shown"]]]  # byte for byte

    retrying = fail_in_ruby(config, r, "failing", 3, "retry")
    act(web, "retries", retrying["RbFlakyLater1"], "retry")
    ran_once(r, retrying["RbFlakyLater1"], attempt=2, args=[1, "RbFlakyLater-needle-1"])
    act(web, "retries", retrying["RbFlakyLater2"], "add")
    ran_once(r, retrying["RbFlakyLater2"], attempt=2)
    third = member_of(r, "retry", retrying["RbFlakyLater3"])
    act(web, "retries", retrying["RbFlakyLater3"], "kill")
    assert r.zcard("retry") == 0 and r.zscore("dead", third) is not None

    act(web, "dead", retrying["RbFlakyLater3"], "retry")
    run = ran_once(r, retrying["RbFlakyLater3"], attempt=2)
    assert run["job"]["retry_count"] == json.loads(third)["retry_count"] - 1
    dying = fail_in_ruby(config, r, "dying", 1, "dead")
    act(web, "dead", dying["RbFlaky1"], "add")
    ran_once(r, dying["RbFlaky1"], attempt=2)
    killed = ruby_data(config, "kill")["killed"]
    act(web, "dead", killed, "retry")  # an ActiveJob Sidekiq::DeadSet#kill put there
    run = ran_once(r, killed, **{"class": "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"})
    assert run["job"]["retry_count"] == 2 and run["args"][0]["job_class"] == "WelcomeJob"
    doomed = ruby_data(config, "kill")["killed"]
    act(web, "dead", doomed, "delete")
    assert r.zcard("dead") == 1  # the scheduled job killed above, only
    assert all(len([x for x in runs(r, RUBY_RUNS) if x["jid"] == jid]) == 1
               for jid in (scheduled["activejob"], retrying["RbFlakyLater1"]))


def test_bulk_actions_on_a_selection_and_on_all(config: Config, web: TestClient,
                                                r: redis.Redis) -> None:
    retrying = fail_in_ruby(config, r, "failing", 4, "retry")
    page = web.get("/retries").text
    chosen = [retrying["RbFlakyLater1"], retrying["RbFlakyLater2"]]
    web.post("/retries", data={"csrf": csrf(page), "action": "retry",
                               "key": [key_of(page, jid) for jid in chosen]})
    for jid in chosen:
        ran_once(r, jid, attempt=2)
    assert r.zcard("retry") == 2
    web.post("/retries/all", data={"csrf": csrf(page), "action": "kill", "confirm": "all"})
    assert r.zcard("retry") == 0 and r.zcard("dead") == 2

    web.post("/dead/all", data={"csrf": csrf(page), "action": "retry", "confirm": "all"})
    for jid in (retrying["RbFlakyLater3"], retrying["RbFlakyLater4"]):
        ran_once(r, jid, attempt=2)
    assert r.zcard("dead") == 0

    scheduled = ruby_data(config, "scheduled")
    page = web.get("/scheduled").text
    web.post("/scheduled", data={"csrf": csrf(page), "action": "delete",
                                 "key": [key_of(page, scheduled["plain"])]})
    assert r.zcard("schedule") == 3
    web.post("/scheduled/all", data={"csrf": csrf(page), "action": "add", "confirm": "all"})
    for name in ("shown", "activejob", "mailer"):
        ran_once(r, scheduled[name])
    assert r.zcard("schedule") == 0
    ruby_data(config, "kill")
    web.post("/dead/all", data={"csrf": csrf(page), "action": "delete", "confirm": "all"})
    assert r.zcard("dead") == 0
    assert len(runs(r, RUBY_RUNS)) == 7  # each moved job ran exactly once


PAGES = ["/", "/busy", "/queues", f"/queues/{HELD}", "/queues/default", "/retries",
         "/scheduled", "/dead", "/metrics", "/metrics/RbFlakyLater", "/metrics/WelcomeJob",
         "/batches", "/workflows", "/periodic", "/limiters", "/unique", "/swarms", "/spool",
         "/profiles"]


def test_every_page_opens_on_ruby_data_and_counts_as_sidekiq_does(
        config: Config, web: TestClient, r: redis.Redis) -> None:
    ruby_data(config, "held", HELD)
    ruby_data(config, "scheduled")
    ruby_data(config, "kill")
    fail_in_ruby(config, r, "failing", 2, "retry")
    fail_in_ruby(config, r, "dying", 1, "dead")
    # Ruby flushes its counters with its beat (a beat may still carry the
    # previous test's runs into this flushed Redis): wait for at least ours.
    wait_for(lambda: int(r.get("stat:failed") or 0) >= 3, what="Ruby's stats flush")
    for path in PAGES:
        reply = web.get(path)
        assert reply.status_code == 200, (path, reply.text[-2000:])
    names = {"processed": "processed", "failed": "failed", "scheduled": "scheduled_size",
             "retries": "retry_size", "dead": "dead_size", "enqueued": "enqueued"}

    def agree() -> dict[str, Any] | None:
        ruby_stats = run_ruby(config.redis_url, "api.rb", "dump")["stats"]
        stats = web.get("/stats.json").json()
        same = {ours: stats[ours] for ours in names} == \
            {ours: ruby_stats[theirs] for ours, theirs in names.items()}
        return stats if same else None

    stats = wait_for(agree, what="the dashboard's counters and Sidekiq::Stats agreeing")
    assert stats["enqueued"] == 4 and stats["dead"] == 2


def test_ruby_number_and_text_formats_survive_every_move(config: Config, web: TestClient,
                                                         r: redis.Redis) -> None:
    """Ruby's big integers, floats and escapes: the member Ruby wrote is the one
    found, moved and removed (no re-dumped look-alike), and Ruby gets the args back."""
    odd = ruby_data(config, "odd")
    wait_for(lambda: r.zcard("retry") == 1, what="Ruby failing the odd job")
    scheduled = member_of(r, "schedule", odd["scheduled"])
    assert odd["scheduled"] in web.get("/scheduled", params={"q": "日本"}).text
    assert odd["scheduled"] in web.get("/scheduled", params={"q": "emoji 😀"}).text
    assert str(escape("語")) in open_entry(web, "scheduled", odd["scheduled"])
    act(web, "scheduled", odd["scheduled"], "kill")
    assert zset_members(r, "dead") == [scheduled] and r.zcard("schedule") == 0
    act(web, "dead", odd["scheduled"], "retry")
    assert r.zcard("dead") == 0
    assert_exact(ran_once(r, odd["scheduled"])["args"], ARGS)

    failing = member_of(r, "retry", odd["failing"])
    act(web, "retries", odd["failing"], "kill")
    assert zset_members(r, "dead") == [failing] and r.zcard("retry") == 0
    act(web, "dead", odd["failing"], "add")
    run = ran_once(r, odd["failing"], attempt=2)
    assert_exact(run["args"], ARGS)
    assert_exact(run["types"], test_interop_support.ruby_types(ARGS))


def test_busy_shows_a_running_ruby_activejob_as_its_own_class(
        config: Config, web: TestClient, r: redis.Redis, ruby: RubySidekiq) -> None:
    slow = ruby_data(config, "slow")["slow"]
    wait_run(r, RUBY_RUNS, slow)
    # Ruby writes what it runs with its next beat (a second here).
    row = wait_for(lambda: next((line for line in web.get("/busy").text.split("<tr>")
                                 if "slow-needle" in line), None), what="the busy row")
    assert ruby.identity in row
    assert "<td>SlowJob</td>" in row and "JobWrapper" not in row and "_aj_" not in row


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install -y "
                                               "chromium; .ci/run installs it)")
def test_in_chromium_a_person_retries_a_ruby_failure_and_ruby_runs_it(
        config: Config, ruby: RubySidekiq, r: redis.Redis) -> None:
    from playwright.sync_api import sync_playwright

    held = ruby_data(config, "held", HELD)
    jid = fail_in_ruby(config, r, "failing", 1, "retry")["RbFlakyLater1"]
    server = subprocess.Popen([str(BIN / "wurk"), "web", "--port", "0", "--redis-url",
                               config.redis_url], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        url = re.search(r"(http://\S+?)/?\s", server.stdout.readline() + " ")
        assert url, "wurk web did not start"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(),
                                                 args=["--no-sandbox"])
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"{url.group(1)}/queues/{HELD}")
            shown = page.locator("main").inner_text()
            assert "UserMailer#welcome" in shown and "Shown::AsThis" in shown
            assert "WelcomeJob" in shown and held["plain"] in shown
            page.goto(f"{url.group(1)}/retries")
            page.locator(f'main a[href$="-{jid}"]').click()
            assert "flaky failure on attempt 1" in page.locator("main").inner_text()
            page.get_by_role("button", name="Retry now").click()
            page.wait_for_url(re.compile(r"/retries\?done=retry"))
            assert "No jobs." in page.locator("main").inner_text()
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
        server.stdout.close()  # type: ignore[union-attr]
    assert r.zcard("retry") == 0
    ran_once(r, jid, attempt=2)

"""The dashboard in a real browser: Debian's chromium driven by Playwright.

One stack for the module (tests/webstack.py): redis-server, a
``wurk-swarm`` whose child runs a slow job, ``wurk web`` on a free port, and the seeded jobs
(with HTML/JS in some arguments). Each test clicks as a person would and
checks both the page and Redis.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from webpages import RUBY_IDENTITY, XSS
from webstack import Stack, chromium, wait_until

CHROMIUM = chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; "
                             ".ci/run installs it)")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = Stack().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(20_000)
    opened.dialogs = []  # every dialog a page opens; a confirm is accepted

    def on_dialog(dialog: Any) -> None:
        opened.dialogs.append((dialog.type, dialog.message))
        dialog.accept()

    opened.on("dialog", on_dialog)
    yield opened
    context.close()


def test_payload_html_never_runs(page: Any, stack: Stack) -> None:
    for path in ("/queues/default?page=1", "/retries", "/retries?q=Greeter", "/dead",
                 "/dead?q=Greeter", "/busy"):
        page.goto(stack.url + path)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img").count() == 0
    page.goto(stack.url + "/retries?q=Greeter")
    assert XSS[0] in page.locator("code.args").first.inner_text()
    page.locator("tbody a").first.click()
    assert page.evaluate("window.__pwned") is None
    assert '<b onmouseover="x()">boom</b>' in page.locator("dl.job").inner_text()
    assert page.dialogs == []


def test_dashboard_totals_history_and_live_rates(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/")
    # Seeded 123,456,789, plus whatever the swarm has run since (the profiled job).
    shown = page.locator('[data-stat="processed"]').inner_text()
    assert re.fullmatch(r"123,456,7\d\d", shown), shown
    assert page.locator("dl.info").inner_text().count("Version") == 1
    # The live graph polls every second: two polls give a rate.
    total = r.incrby("stat:processed", 50)
    wait_until(lambda: page.locator('[data-rate="processed"]').inner_text() != "\u2013")
    wait_until(lambda: page.locator('[data-stat="processed"]').inner_text() == f"{total:,}")
    page.get_by_role("link", name="7 days").click()
    assert page.url.endswith("/?days=7")
    assert page.locator('.tabs a[aria-current="page"]').inner_text() == "7 days"
    assert page.evaluate("JSON.parse(document.getElementById('history-data').textContent)"
                         ".dates.length") == 7


def test_pause_unpause_page_delete_and_clear_queues(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/queues")
    row = page.locator("tr", has_text="critical")
    row.get_by_role("button", name="Pause").click()
    assert r.sismember("paused", "critical")
    assert "paused" in page.locator("tr", has_text="critical").inner_text()
    page.locator("tr", has_text="critical").get_by_role("button", name="Unpause").click()
    assert not r.sismember("paused", "critical")

    page.get_by_role("link", name="default", exact=True).click()
    assert "Page 1 of 2" in page.locator(".pager").first.inner_text()
    page.get_by_role("link", name="Next \u203a").first.click()
    assert "Page 2 of 2" in page.locator(".pager").first.inner_text()
    before = r.llen("queue:default")
    page.locator("tbody").get_by_role("button", name="Delete").first.click()
    assert r.llen("queue:default") == before - 1
    assert "Job deleted." in page.locator(".flash").inner_text()

    page.goto(stack.url + "/queues")
    page.locator("tr", has_text="mailers").get_by_role("button", name="Clear").click()
    page.wait_for_url("**/queues?done=cleared")
    assert page.dialogs[-1][0] == "confirm" and "mailers" in page.dialogs[-1][1]
    assert r.llen("queue:mailers") == 0 and not r.sismember("queues", "mailers")


def test_a_dismissed_confirmation_changes_nothing(browser: Any, stack: Stack) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.dismiss())
    page.goto(stack.url + "/queues")
    page.locator("tr", has_text="critical").get_by_role("button", name="Clear").click()
    page.wait_for_timeout(300)
    assert stack.client().llen("queue:critical") >= 1
    context.close()


def test_search_open_and_retry_a_retry(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/retries")
    page.get_by_label("Search class, jid or arguments").fill("timeout #3")
    page.get_by_role("button", name="Search").click()
    assert "1 match for" in page.locator("main").inner_text()
    page.locator("tbody a").first.click()
    assert "app/jobs/syncaccount.py:12:in run" in page.locator("pre.backtrace").inner_text()
    assert "error_backtrace" in page.locator("table.fields").inner_text()
    size, queued = r.zcard("retry"), r.llen("queue:default")
    page.get_by_role("button", name="Retry now").click()
    assert r.zcard("retry") == size - 1 and r.llen("queue:default") == queued + 1
    assert "Retried: 1 job." in page.locator(".flash").inner_text()


def test_bulk_delete_and_kill_on_a_selection(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/retries")
    boxes = page.locator('input[name="key"]')
    boxes.nth(0).check()
    boxes.nth(1).check()
    size = r.zcard("retry")
    page.locator("#bulk").get_by_role("button", name="Delete").click()
    assert r.zcard("retry") == size - 2
    dead = r.zcard("dead")
    page.locator("#check-all").check()
    assert page.locator('input[name="key"]:checked').count() == size - 2
    page.locator("#bulk").get_by_role("button", name="Kill").click()
    assert r.zcard("retry") == 0 and r.zcard("dead") == dead + size - 2


def test_scheduled_add_to_queue_and_dead_retry_all(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/scheduled")
    page.locator('input[name="key"]').first.check()
    page.locator("#bulk").get_by_role("button", name="Add to queue").click()
    assert r.zcard("schedule") == 0
    page.goto(stack.url + "/dead?sort=asc")
    assert "earliest first (" in page.locator("main").inner_text()
    queued = r.llen("queue:critical") + r.llen("queue:default")
    dead = r.zcard("dead")
    page.get_by_role("button", name="Retry now all").click()
    page.wait_for_url("**/dead?done=retry*")
    assert page.dialogs and "every job in Dead" in page.dialogs[-1][1]
    assert r.zcard("dead") == 0
    assert r.llen("queue:critical") + r.llen("queue:default") == queued + dead


def test_busy_shows_ruby_and_wurk_and_quiet_and_stop_work(page: Any, stack: Stack) -> None:
    r = stack.client()
    wait_until(lambda: r.scard("processes") >= 3)
    page.goto(stack.url + "/busy")
    wait_until(lambda: "SlowReport" in fresh(page))
    text = page.locator("main").inner_text()
    assert "ruby-host:4242" in text and "billing" in text and "ChargeCard" in text
    assert text.count("slot slow") == 2
    ruby = page.locator("tr", has_text="ruby-host:4242")
    ruby.get_by_role("button", name="Quiet").click()
    assert r.lrange(f"{RUBY_IDENTITY}-signals", 0, -1) == ["TSTP"]
    child = page.locator("tbody tr", has_text="slot slow").first
    pid = int(re.search(r":(\d+)", child.locator("strong").inner_text()).group(1))  # type: ignore[union-attr]
    child.get_by_role("button", name="Stop").click()
    assert "Stop signal sent" in page.locator(".flash").inner_text()
    # The real child picks the TERM up at its next heartbeat and exits; the
    # swarm parent forks a replacement, which the page then lists.
    wait_until(lambda: gone(pid), timeout=30)
    wait_until(lambda: (text := fresh(page)).count("slot slow") == 2
               and f":{pid}" not in text, timeout=30)


def fresh(page: Any, selector: str = "main") -> str:
    """The text of ``selector`` after a reload (what a person sees on F5)."""
    page.reload()
    text: str = page.locator(selector).first.inner_text()
    return text


def _children(page: Any) -> list[int]:
    page.reload()
    return sorted(int(pid) for pid in re.findall(r"pid (\d+)", page.locator("main").inner_text()))


def test_swarm_scale_restart_quiet_and_stop(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/swarms")
    # The swarm's parent shows once its first heartbeat is in, which a loaded machine delays.
    wait_until(lambda: "topology" in fresh(page, "main"))
    first = wait_until(lambda: len(_children(page)) == 2 and _children(page))
    page.get_by_role("button", name="One more per slot").click()
    assert "one more child per slot" in page.locator(".flash").inner_text()
    wait_until(lambda: len(_children(page)) == 3, timeout=20)
    page.get_by_role("button", name="One fewer per slot").click()
    page.wait_for_load_state()
    wait_until(lambda: len(_children(page)) == 2, timeout=20)
    survivors = _children(page)
    page.get_by_role("button", name="Rolling restart").click()
    page.wait_for_url("**/swarms?done=swarm-restart")
    assert page.dialogs and "one at a time" in page.dialogs[-1][1]
    wait_until(lambda: (now := _children(page)) and len(now) == 2
               and not set(now) & set(survivors), timeout=40)
    assert set(first) != set(_children(page))
    page.get_by_role("button", name="Quiet").click()
    wait_until(lambda: "quiet" in fresh(page, "h2"))
    [identity] = r.smembers("wurk:swarms")
    assert r.hget(identity, "state") == "quiet"
    page.get_by_role("button", name="Stop").click()
    page.wait_for_url("**/swarms?done=swarm-stop")
    assert stack.worker.wait(30) == 0


def test_profiles_list_and_top_functions(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/")
    page.get_by_role("link", name="Profiles").click()
    wait_until(lambda: "nightly-report" in fresh(page))
    page.get_by_role("link", name="nightly-report").click()
    assert "webjobs.py" in page.locator("table").inner_text()
    page.get_by_role("link", name="Own time").click()
    assert page.url.endswith("?sort=tottime")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download").click()
    assert download.value.suggested_filename.endswith(".prof")


def test_read_only_shows_no_buttons(browser: Any, stack: Stack) -> None:
    url = stack.web("--read-only")
    context = browser.new_context()
    page = context.new_page()
    for path in ("/queues", "/dead", "/busy", "/swarms", "/queues/default"):
        page.goto(url + path)
        assert page.locator("main form[method=post]").count() == 0
        assert "read-only" in page.locator("header").inner_text()
    context.close()


def test_keyboard_phone_width_and_dark_mode(browser: Any, stack: Stack) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  color_scheme="dark")
    page = context.new_page()
    page.goto(stack.url + "/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(18, 21, 27)"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "wurk"
    page.goto(stack.url + "/busy")
    assert page.locator("time").first.get_attribute("title").endswith("UTC")
    context.close()

"""The pages of wurk-only features and Metrics in a real browser (Debian's chromium).

Same stack as tests/test_web_browser.py (tests/webstack.py: redis-server, a
``wurk-swarm`` running real jobs, ``wurk web``), plus periodic entries,
limiters, unique locks, a spool file and Sidekiq 7 metrics
(tests/webfeatures.py). Each test clicks as a person would and checks the
page and Redis.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webbatches import seed_batches
from webfeatures import seed_features, spool_file
from webstack import Stack, chromium, wait_until

import wurk
import wurk.api
from wurk.settings.config import Config

CHROMIUM = chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; "
                             ".ci/run installs it)")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    running = Stack().start()
    try:  # a seed that fails must not leave the stack's processes behind
        wurk.configure(running.config)
        running.features = seed_features(running.config)  # type: ignore[attr-defined]
        running.batches = seed_batches(running.config)  # type: ignore[attr-defined]
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
    opened.dialogs = []

    def on_dialog(dialog: Any) -> None:
        opened.dialogs.append((dialog.type, dialog.message))
        dialog.accept()

    opened.on("dialog", on_dialog)
    yield opened
    context.close()


def fresh(page: Any) -> str:
    page.reload()
    text: str = page.locator("main").inner_text()
    return text


def canvas_painted(page: Any, selector: str) -> bool:
    """True when the canvas holds drawn pixels (the script ran and drew)."""
    return bool(page.evaluate(
        """(sel) => { const c = document.querySelector(sel);
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
             for (let i = 3; i < d.length; i += 4) { if (d[i] > 0) return true; }
             return false; }""", selector))


def test_metrics_table_detail_histogram_and_chart(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/")
    page.get_by_role("link", name="Metrics").click()
    table = page.locator("table.metrics")
    assert "ImportCsv" in table.inner_text() and "SendInvoice" in table.inner_text()
    # The swarm's own runs of SlowReport show up once a beat wrote them.
    wait_until(lambda: "SlowReport" in fresh(page), timeout=30)
    page.get_by_role("link", name="4 hours").click()
    assert page.url.endswith("/metrics?hours=4")
    page.get_by_role("link", name="SendInvoice").click()
    assert page.locator("h1").inner_text() == "SendInvoice"
    assert "Executions" in page.locator("#class-totals").inner_text()
    cells = page.locator("table.histogram tbody td").all_inner_texts()
    assert len(cells) == 26 and sum(int(c.replace(",", "")) for c in cells) > 0
    # The graphs are drawn by a deferred script: wait for the pixels, do not sample once.
    wait_until(lambda: canvas_painted(page, "#histogram") and canvas_painted(page, "#executions"),
               timeout=30)
    assert page.evaluate("window.__pwned") is None


def test_metrics_names_sidekiq_6_processes(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/metrics")
    assert "Sidekiq 6.x, which records no metrics" in page.locator(".flash").inner_text()


def test_periodic_pause_unpause_and_detail(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/periodic")
    row = page.locator("tr", has_text="nightly-report")
    assert "Europe/Paris" in row.inner_text() and "in " in row.inner_text()
    row.get_by_role("button", name="Pause").click()
    assert "Paused" in page.locator(".flash").inner_text()
    assert r.hget("loops:nightly-report", "paused") == "1"
    page.locator("tr", has_text="nightly-report").get_by_role("button", name="Unpause").click()
    assert r.hget("loops:nightly-report", "paused") == "0"
    page.get_by_role("link", name="nightly-report").click()
    assert page.locator("ol.runs li").count() == 5
    assert page.locator("tbody tr").count() == 5
    page.get_by_role("button", name="Pause").click()
    assert page.url.endswith("/periodic/nightly-report?done=periodic-paused")
    assert r.hget("loops:nightly-report", "paused") == "1"
    assert "None while paused." in page.locator("main").inner_text()


def test_limiter_reset_asks_and_empties(page: Any, stack: Stack) -> None:
    r = stack.client()
    assert r.zcard("lmtr-cs:stripe-api") == 1
    page.goto(stack.url + "/limiters")
    assert "WRONGTYPE" in page.locator("tr", has_text="broken").inner_text()
    row = page.locator("tr", has_text="stripe-api")
    assert "concurrent" in row.inner_text()
    row.get_by_role("button", name="Reset").click()
    page.wait_for_url("**/limiters?done=limiter-reset")
    assert page.dialogs and "stripe-api" in page.dialogs[-1][1]
    assert r.zcard("lmtr-cs:stripe-api") == 0


def test_unique_release_asks_and_drops_the_lock(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/unique")
    before = len(r.keys("unique:*"))
    assert page.locator("tbody tr").count() == before >= 1
    key = page.locator("tbody tr code").first.inner_text()
    page.locator("tbody tr").first.get_by_role("button", name="Release").click()
    page.wait_for_url("**/unique?done=unique-released")
    assert page.dialogs and "duplicate" in page.dialogs[-1][1]
    assert not r.exists(key) and len(r.keys("unique:*")) == before - 1


def test_spool_shows_jobs_discards_and_pushes(page: Any, stack: Stack, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``wurk web`` of its own, on a spool directory the swarm's children (which
    push their machine's spool on their own) do not look into."""
    r = stack.client()
    monkeypatch.setenv("WURK_SPOOL_DIR", str(tmp_path / "spool"))
    url = stack.web()
    local = Config(redis_url=stack.config.redis_url, spool_dir=str(tmp_path / "spool"))
    keep = spool_file(local, 2, klass="Refund")
    drop = spool_file(local, 4, klass="Doomed")
    page.goto(url + "/spool")
    assert "machine running this dashboard" in page.locator("main").inner_text()
    page.get_by_role("link", name=drop.name).click()
    page.wait_for_load_state()  # count() reads the page as it is: let the new one load
    assert page.locator("tbody tr").count() == 4 and "Doomed" in page.locator("tbody").inner_text()
    page.go_back()
    page.locator("tr", has_text=drop.name).get_by_role("button", name="Discard").click()
    page.wait_for_url("**/spool?done=spool-discarded")
    assert page.dialogs and "never pushed" in page.dialogs[-1][1]
    assert not drop.exists() and keep.exists()
    before = r.llen("queue:default")
    page.get_by_role("button", name="Push now").click()
    assert "Spool pushed: 2 jobs." in page.locator(".flash").inner_text()
    assert not keep.exists() and r.llen("queue:default") == before + 2


def test_batches_list_detail_child_and_workflow_steps(page: Any, stack: Stack) -> None:
    seeded = stack.batches  # type: ignore[attr-defined]
    page.goto(stack.url + "/")
    page.get_by_role("link", name="Batches", exact=True).click()
    page.wait_for_load_state()
    table = page.locator("table.batches")
    row = table.locator("tr", has_text="nightly import 42")
    assert "complete" in row.inner_text() and "6 / 8" in row.inner_text()
    assert "abandoned" in table.locator("tr", has_text="left open").inner_text()
    row.get_by_role("link").first.click()
    page.wait_for_load_state()
    assert seeded["nightly"] in page.locator("h1").inner_text()
    failures = page.locator("#batch-failures tbody tr")
    assert failures.count() == 2 and "ValueError" in failures.first.inner_text()
    assert "<img src=x" in failures.first.inner_text()  # shown as text, never as markup
    page.locator("#batch-children a").click()
    page.wait_for_load_state()
    assert seeded["child"] in page.locator("h1").inner_text()
    page.locator("#batch-info").get_by_role("link", name=seeded["nightly"]).click()
    page.wait_for_load_state()
    assert seeded["nightly"] in page.locator("h1").inner_text()
    page.get_by_role("link", name="Workflows", exact=True).click()
    page.wait_for_load_state()
    page.locator("table.workflows").get_by_role("link", name=seeded["workflow"]).click()
    page.wait_for_load_state()
    steps = page.locator("#workflow-steps tbody tr").all_inner_texts()
    assert [s.split("\t")[0] for s in steps] == ["FetchFeed", "parse", "report"]
    assert "succeeded" in steps[0] and "failed" in steps[1] and "KeyError" in steps[1]
    assert "skipped" in steps[2]
    page.screenshot(path=str(Path(os.environ.get("WURK_SHOTS", "/tmp")) / "workflow.png"),
                    full_page=True)
    page.locator("#workflow-steps").get_by_role("link").nth(1).click()
    page.wait_for_load_state()
    assert "Batch" in page.locator("h1").inner_text() and "KeyError" in fresh(page)
    assert page.evaluate("window.__pwned") is None


def test_read_only_hides_the_new_buttons(browser: Any, stack: Stack) -> None:
    url = stack.web("--read-only")
    context = browser.new_context()
    page = context.new_page()
    for path in ("/periodic", "/periodic/nightly-report", "/limiters", "/unique", "/spool",
                 "/metrics"):
        page.goto(url + path)
        assert page.locator("main form[method=post]").count() == 0
    context.close()


def test_phone_width_with_the_longer_menu(browser: Any, stack: Stack) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    for path in ("/metrics", "/metrics/ImportCsv", "/periodic", "/limiters", "/spool",
                 "/batches", "/workflows"):
        page.goto(stack.url + path)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    context.close()


def _slot_children(page: Any) -> list[tuple[int, str]]:
    """(pid, restarts) of each child row on a fresh Swarms page."""
    page.reload()
    rows = page.locator("tbody tr").all()
    found = []
    for row in rows:
        cells = row.locator("td").all_inner_texts()
        pid = re.search(r"pid (\d+)", " ".join(cells))
        if pid:
            found.append((int(pid.group(1)), cells[-1].strip()))
    return found


def test_swarm_scales_one_slot_and_counts_restarts(page: Any, stack: Stack) -> None:
    r = stack.client()
    page.goto(stack.url + "/swarms")
    wait_until(lambda: len(_slot_children(page)) == 2)
    page.get_by_role("button", name="One more child in slot slow").click()
    assert "one more child in that slot" in page.locator(".flash").inner_text()
    [identity] = r.smembers("wurk:swarms")
    wait_until(lambda: len(_slot_children(page)) == 3, timeout=30)
    assert wurk.api.SwarmSet(config=stack.config).get(identity).slots == {"slow": 3}
    victim, restarts = _slot_children(page)[-1]
    assert restarts == "0"
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: (now := _slot_children(page)) and len(now) == 3
               and victim not in [p for p, _ in now] and "1" in [n for _, n in now],
               timeout=40)
    page.get_by_role("button", name="One fewer child in slot slow").click()
    wait_until(lambda: len(_slot_children(page)) == 2, timeout=30)

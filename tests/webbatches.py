"""Batches and workflows for the dashboard tests and scripts/screenshots, made by running them.

``seed_batches(config)`` builds, through ``wurk.Batch`` and ``wurk.Workflow``:
a finished import batch with failing rows (in the retry set), a child
batch, an open batch left abandoned (its ``updated_at`` set two days
back), and a workflow whose middle step dies (policy "stop"); then runs
their jobs on an in-process Launcher on queue ``batches`` until the import
completed and the workflow stopped. Descriptions and errors carry HTML.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from waiting import wait_for

import wurk
from wurk.api import BatchStatus
from wurk.redis.runtime import runtime_for
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

QUEUE = "batches"
XSS_TEXT = '<img src=x onerror="window.__pwned=4">'


@wurk.job(name="ImportRow", queue=QUEUE, retry=5, retry_in=lambda *a: 3600)
def import_row(n: int) -> int:
    if n % 4 == 3:
        raise ValueError(f"row {n}: bad date {XSS_TEXT}")
    return n


@wurk.job(name="ImportDone", queue=QUEUE)
def import_done(status: Any, batch_id: int) -> None:
    pass


@wurk.job(name="FetchFeed", queue=QUEUE)
def fetch_feed(url: str) -> str:
    return url


@wurk.job(name="ParseFeed", queue=QUEUE, retry=0)
def parse_feed(n: int) -> None:
    if n == 2:
        raise KeyError(f"entry {n} {XSS_TEXT}")


@wurk.job(name="FeedReport", queue=QUEUE)
def feed_report(n: int) -> None:
    pass


def seed_batches(config: Config) -> dict[str, Any]:
    with wurk.Batch(f"nightly import 42 {XSS_TEXT}", on_complete=(import_done, [42]),
                    on_success=(import_done, [42])) as nightly:
        for n in range(8):
            nightly.add(import_row, n)
        with wurk.Batch("thumbnails") as child:
            child.add(import_row, 100)
    left = wurk.Batch("left open by a crashed builder")
    # Its job waits in a queue nobody works, so the batch stays open.
    left.push({"class": "FetchFeed", "queue": "parked", "args": ["http://example.com/never"]})
    runtime_for(config).pool.call("HSET", f"b-{left.bid}", "updated_at",
                                  str(time.time() - 2 * 86400))
    flow = (wurk.step(fetch_feed, "http://example.com/feed")
            >> wurk.group(parse_feed, [[1], [2], [3]], name="parse")
            >> wurk.step(feed_report, 7, name="report"))
    wid = wurk.Workflow(flow, description="feed refresh", queue=QUEUE).start()
    launcher = Launcher(dataclasses.replace(config, queues=[QUEUE]))
    launcher.start()
    try:
        wait_for(lambda: BatchStatus.read(nightly.bid, config=config).complete, timeout=20,
                 what="the import batch completed")
        wait_for(lambda: wurk.Workflow.status(wid).finished, timeout=20,
                 what="the workflow stopped")
    finally:
        launcher.stop(time.monotonic() + 2)
    return {"nightly": nightly.bid, "child": child.bid, "left": left.bid, "workflow": wid}

"""Data for the dashboard's pages of wurk-only features, for tests and scripts/screenshots.

``seed_features(config)`` registers two periodic entries (one paused, one
with a history of fires), three limiters (a concurrent one with a holder, a
window and a garbage one), unique locks (real unique pushes to the queue
``feeds``), and two hours of per-class metrics written as Ruby Sidekiq 7
writes them (``ruby7_metrics``), so every page has something to show.
``spool_file`` writes a spool file as an exiting process would.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import wurk
import wurk.limiter
from wurk.push import spool
from wurk.push.periodic import make_entry
from wurk.redis.runtime import runtime_for
from wurk.runtime.periodic_guard import register
from wurk.settings.config import Config

METRIC_CLASSES = {"ImportCsv": (900, 3), "SendInvoice": (120, 8), "ResizeImage": (40, 5),
                  "SyncAccount": (2500, 2)}


def ruby7_metrics(config: Config, cls: str, at: datetime, *, p: int, f: int, ms: int,
                  buckets: dict[int, int]) -> None:
    """What Sidekiq 7.x's ExecutionTracker#flush writes for one class and minute."""
    minute = f"j|{at.strftime('%Y%m%d')}|{at.hour}:{at.minute}"
    hist = f"{cls}-{at.strftime('%d-%H')}:{at.minute}"
    gram: list[Any] = [hist, "OVERFLOW", "SAT"]
    for index, count in buckets.items():
        gram += ["INCRBY", "u16", f"#{index}", count]
    runtime_for(config).pool.pipeline([
        ("HINCRBY", minute, f"{cls}|ms", ms), ("HINCRBY", minute, f"{cls}|p", p),
        ("HINCRBY", minute, f"{cls}|f", f), ("EXPIRE", minute, 8 * 3600),
        ("BITFIELD", *gram), ("EXPIRE", hist, 8 * 3600)])


def seed_metrics(config: Config, minutes: int = 120) -> None:
    now = time.time()
    for back in range(minutes):
        at = datetime.fromtimestamp(now - 60 * back, UTC)
        for n, (cls, (ms, rate)) in enumerate(METRIC_CLASSES.items()):
            runs = max(0, int(rate * (2 + math.sin((back + 9 * n) / 9))))
            failed = 1 if (back + n) % 17 == 0 and runs else 0
            done = runs - failed
            slot = min(25, max(0, int(math.log(ms / 20, 1.5)) + 1))
            spread = {slot: done - done // 3, max(0, slot - 1): done // 4,
                      min(25, slot + 1): done // 3 - done // 4}
            ruby7_metrics(config, cls, at, p=runs, f=failed, ms=ms * done,
                          buckets={k: v for k, v in spread.items() if v > 0})


def seed_features(config: Config) -> dict[str, Any]:
    pool = runtime_for(config).pool
    now = time.time()
    register(pool, [make_entry("*/15 * * * *", "NightlyReport", name="nightly-report",
                               tz="Europe/Paris", args=[1, "full"]),
                    make_entry("0 4 * * *", "PurgeSessions", name="purge-sessions",
                               queue="low", paused=True)], now)
    pool.pipeline([("LPUSH", "loop-history:nightly-report",
                    json.dumps([int(now) - 900 * k, f"{k:024x}"])) for k in range(5, 0, -1)]
                  + [("HSET", "loops:nightly-report", "lf", int(now) - 900)])
    db = wurk.limiter.concurrent("stripe-api", 3, lease=600, wait_timeout=0)
    permit = db.try_acquire()
    window = wurk.limiter.window("emails", 100, interval=60, wait_timeout=0)
    for _ in range(7):
        window.try_acquire()
    pool.pipeline([("SADD", "lmtr-list", "broken"), ("SET", "lmtr:broken", "garbage")])
    client = wurk.Client(config)
    jids = [client.push({"class": "FeedRefresh", "queue": "feeds", "args": [n],
                         "unique_for": 3600}) for n in (1, 2, 3)]
    seed_metrics(config)
    return {"permit": permit, "unique_jids": jids}


def spool_file(config: Config, count: int, *, target: str | None = None,
               klass: str = "ChargeCard") -> Path:
    """A spool file as a process that exited with Redis away writes it."""
    entries = []
    for n in range(count):
        jid = secrets.token_hex(12)
        job = {"class": klass, "queue": "default", "args": [n, "<b>bold</b>"], "jid": jid,
               "created_at": time.time(), "retry": True}
        entries.append(spool.SpoolEntry(secrets.token_hex(8), jid, "default", None,
                                         json.dumps(job)))
    return spool.write_spool(spool.spool_dir(config), target or spool.target_of(config),
                             entries)

"""Shared data for the dashboard tests and scripts/screenshots: jobs in every place.

``seed(config)`` pushes real jobs through wurk.Client into two queues,
puts failed jobs in the retry set and the morgue (with error fields and a
compressed backtrace, as the retry code writes them), schedules a job,
writes 30 days of daily stats, and registers a heartbeat and a running job
in Ruby Sidekiq 6.4's format (``<identity>:workers``), so every page has
something to show. One job of each kind carries HTML/JS in its args.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import wurk
from wurk.api import DeadSet
from wurk.redis.runtime import runtime_for
from wurk.runtime.retry import encode_backtrace
from wurk.settings.config import Config

XSS = ['<script>window.__pwned = 1</script>', '"><img src=x onerror="window.__pwned=2">',
       "</script><script>window.__pwned=3</script>"]
RUBY_IDENTITY = "ruby-host:4242:abcdef123456"
AJ_WRAPPER = "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"


def failed(klass: str, args: list[Any], queue: str, error: str, count: int) -> dict[str, Any]:
    now = time.time()
    return {"class": klass, "args": args, "queue": queue, "retry": True,
            "jid": f"{abs(hash((klass, json.dumps(args)))) % 16**24:024x}",
            "created_at": now - 3600, "enqueued_at": now - 3500, "failed_at": now - 3000,
            "retried_at": now - 600, "retry_count": count, "error_class": "RuntimeError",
            "error_message": error,
            "error_backtrace": encode_backtrace([f"app/jobs/{klass.lower()}.py:{n}:in run"
                                                 for n in (12, 40, 77)])}


def seed(config: Config) -> dict[str, Any]:
    client = wurk.Client(config)
    jids: dict[str, Any] = {"default": []}
    for n in range(30):
        jids["default"].append(client.push({"class": "ResizeImage", "queue": "default",
                                            "args": [n, f"photo-{n}.png", {"w": 640}]}))
    jids["xss_queued"] = client.push({"class": "Greeter", "queue": "default", "args": XSS})
    client.push({"class": AJ_WRAPPER, "queue": "mailers",
                 "wrapped": "ActionMailer::MailDeliveryJob",
                 "args": [{"job_class": "ActionMailer::MailDeliveryJob",
                           "job_id": "aj-1", "queue_name": "mailers",
                           "arguments": ["SignupMailer", "welcome", "deliver_now",
                                         {"args": [42], "_aj_ruby2_keywords": ["args"]}]}]})
    client.push({"class": "Report", "queue": "critical", "args": ["weekly"]})
    jids["scheduled"] = client.push({"class": "Reminder", "queue": "default",
                                     "args": ["tomorrow"], "at": time.time() + 86400})
    pool = runtime_for(config).pool
    retry_items = [failed("SyncAccount", [n, "acct"], "default", f"timeout #{n}", n % 5)
                   for n in range(12)]
    retry_items.append(failed("Greeter", XSS, "default", '<b onmouseover="x()">boom</b>', 1))
    now = time.time()
    pool.call("ZADD", "retry", *[x for i, item in enumerate(retry_items)
                                 for x in (now + 60 * (i + 1), json.dumps(item))])
    jids["retry"] = [item["jid"] for item in retry_items]
    dead = DeadSet(config=config)
    for n in range(8):
        dead.kill(failed("ChargeCard", [n], "critical", "card declined", 25),
                  notify_failure=False)
    dead.kill(failed("Greeter", XSS, "default", "<script>alert(1)</script>", 25),
              notify_failure=False)
    today = datetime.now(UTC).date()
    commands: list[tuple[Any, ...]] = []
    for back in range(30):
        day = (today - timedelta(days=back)).isoformat()
        commands += [("SET", f"stat:processed:{day}", 1000 + 37 * ((back * 7) % 23)),
                     ("SET", f"stat:failed:{day}", 10 + (back * 3) % 17)]
    commands += [("SET", "stat:processed", 123456789), ("SET", "stat:failed", 4321)]
    pool.pipeline(commands)
    ruby_process(config)
    return jids


def ruby_process(config: Config, identity: str = RUBY_IDENTITY) -> None:
    """A live Sidekiq 6.4 process, as its heartbeat writes it, running one job."""
    now = time.time()
    info = {"hostname": "ruby-host", "started_at": now - 7200, "pid": 4242, "tag": "billing",
            "concurrency": 5, "queues": ["critical", "default"], "labels": [],
            "identity": identity, "version": "6.4.1"}
    work = {"queue": "critical", "run_at": int(now - 42),
            "payload": json.dumps({"class": "ChargeCard", "args": [99, XSS[1]],
                                   "jid": "ruby0000jid", "queue": "critical"})}
    runtime_for(config).pool.pipeline([
        ("SADD", "processes", identity),
        ("HSET", identity, "info", json.dumps(info), "busy", 1, "beat", now, "quiet", "false",
         "rss", 204800),
        ("EXPIRE", identity, 600),
        ("HSET", f"{identity}:workers", "tid-ruby1", json.dumps(work)),
        ("EXPIRE", f"{identity}:workers", 600),
    ])

"""ActiveJob payloads read through wurk.api as Sidekiq's API reads them.

The payloads are shaped as Rails 7's Sidekiq adapter writes them. Sidekiq's
``JobRecord#display_class`` and ``#display_args`` (lib/sidekiq/api.rb)
unwrap ``wrapped``, join a mailer's first two arguments with "#" and drop
its first three arguments (7.x shows a ``MailDeliveryJob``'s params and
args, 6.4 only its args); from 6.5 on they also turn
``{"_aj_globalid": gid}`` into the gid and drop the other ``_aj_`` keys.
Debian's Sidekiq 6.4.1 reads the same entries here and must pick the same
class and arguments. Sidekiq 7.3+'s own wrapper,
``Sidekiq::ActiveJob::Wrapper``, which 6.4 predates, must display exactly
like the adapter's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from test_interop_support import run_ruby

from wurk.api import Queue
from wurk.api.records import JobRecord
from wurk.settings.config import Config
from wurk.wire.activejob import deserialize

ADAPTER = "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"
SIDEKIQ_WRAPPER = "Sidekiq::ActiveJob::Wrapper"
USER = {"_aj_globalid": "gid://shop/User/42"}


def rails_job(jid: str, job_class: str, arguments: list[Any], klass: str = ADAPTER) -> str:
    return json.dumps({
        "class": klass, "wrapped": job_class, "queue": "rails", "jid": jid, "retry": True,
        "created_at": 1796022177.5, "enqueued_at": 1796022177.6,
        "args": [{"job_class": job_class, "job_id": f"aj-{jid}", "provider_job_id": None,
                  "queue_name": "rails", "priority": None, "arguments": arguments,
                  "executions": 0, "exception_executions": {}, "locale": "en",
                  "timezone": "UTC", "enqueued_at": "2026-11-30T12:00:00Z"}]})


CASES = {
    "plain": ("ChargeJob", [USER, 1999, {"note": "rush", "_aj_symbol_keys": ["note"]}],
              "ChargeJob", ["gid://shop/User/42", 1999, {"note": "rush"}]),
    "keywords": ("ReportJob", [{"month": 11, "_aj_ruby2_keywords": ["month"]}],
                 "ReportJob", [{"month": 11}]),
    "nested": ("SyncJob", [[USER, {"owner": USER, "_aj_symbol_keys": []}]],
               "SyncJob", [["gid://shop/User/42", {"owner": "gid://shop/User/42"}]]),
    "deliver": ("ActionMailer::MailDeliveryJob",
                ["UserMailer", "welcome", "deliver_now",
                 {"params": {"user": USER, "_aj_symbol_keys": ["user"]}, "args": [USER, "hi"],
                  "_aj_ruby2_keywords": ["params", "args"]}],
                "UserMailer#welcome", [{"user": "gid://shop/User/42"},
                                       ["gid://shop/User/42", "hi"]]),
    "old_deliver": ("ActionMailer::DeliveryJob",
                    ["NewsMailer", "digest", "deliver_now", USER, 3],
                    "NewsMailer#digest", ["gid://shop/User/42", 3]),
}


@pytest.mark.parametrize("wrapper", [ADAPTER, SIDEKIQ_WRAPPER])
@pytest.mark.parametrize("case", sorted(CASES))
def test_wrapped_jobs_show_their_class_and_real_arguments(config: Config, case: str,
                                                          wrapper: str) -> None:
    job_class, arguments, shown_class, shown_args = CASES[case]
    record = JobRecord(rails_job("a" * 24, job_class, arguments, wrapper), config=config)
    assert (record.klass, record.display_args) == (shown_class, shown_args)
    assert record.class_name == wrapper


def test_sidekiq_shows_the_adapters_jobs_as_wurk_does(config: Config,
                                                      r: redis.Redis) -> None:
    for i, name in enumerate(sorted(CASES)):
        job_class, arguments, _, _ = CASES[name]
        r.lpush("queue:rails", rails_job(f"{i:024d}", job_class, arguments))
    r.sadd("queues", "rails")
    ours = {rec.jid: (rec.klass, rec.display_args) for rec in Queue("rails", config=config)}
    [ruby_queue] = run_ruby(config.redis_url, "api.rb", "dump")["queues"]
    # 6.4 picks the same class and the same arguments but shows ActiveJob's
    # bookkeeping raw (the deserialize step came in 6.5), and shows only a
    # MailDeliveryJob's "args" where 7.x shows [params, args], as wurk does.
    theirs = {job["jid"]: (job["display_class"], deserialize(job["display_args"]))
              for job in ruby_queue["jobs"]}
    mail = "0" * 24  # "deliver" sorts first
    assert ours.pop(mail)[1][1] == theirs.pop(mail)[1]
    assert ours == theirs
    assert len(ours) == len(CASES) - 1

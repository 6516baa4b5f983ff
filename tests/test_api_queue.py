"""wurk.api queues and job records against Redis state shaped like Ruby's (spec §1, §2)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from test_api_support import RUBY_JOB, job_json, launched, recording_job
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.api import JobNotFoundError, JobRecord, Queue, UnknownQueueError
from wurk.runtime.retry import encode_backtrace
from wurk.settings.config import Config

WRAPPER = "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper"


def test_all_lists_known_queues_sorted_by_name(config: Config, r: redis.Redis) -> None:
    r.sadd("queues", "mail", "default", "critical")
    assert [q.name for q in Queue.all(config=config)] == ["critical", "default", "mail"]


def test_get_must_exist_raises_a_lookup_error_naming_the_queue(config: Config,
                                                                 r: redis.Redis) -> None:
    r.sadd("queues", "default")
    assert Queue.get("default", must_exist=True, config=config).name == "default"
    assert Queue.get("nope", config=config).size == 0
    with pytest.raises(UnknownQueueError, match="'nope'") as err:
        Queue.get("nope", must_exist=True, config=config)
    assert isinstance(err.value, LookupError)


def test_size_counts_the_list(config: Config) -> None:
    client = wurk.Client(config)
    client.push_bulk({"class": "X", "args": [[i] for i in range(7)]})
    assert Queue("default", config=config).size == 7
    assert len(Queue("default", config=config)) == 7


def test_latency_reads_float_seconds_from_the_oldest_job(config: Config, r: redis.Redis) -> None:
    r.lpush("queue:default", job_json(enqueued_at=time.time() - 30.0))  # oldest, index -1
    r.lpush("queue:default", job_json(enqueued_at=time.time() - 1.0))
    assert Queue(config=config).latency == pytest.approx(30.0, abs=0.5)


def test_latency_reads_sidekiq_8_integer_ms(config: Config, r: redis.Redis) -> None:
    r.lpush("queue:default", job_json(enqueued_at=int((time.time() - 12.0) * 1000)))
    assert Queue(config=config).latency == pytest.approx(12.0, abs=0.5)


def test_latency_is_zero_when_empty_absent_or_unreadable(config: Config, r: redis.Redis) -> None:
    assert Queue("empty", config=config).latency == 0.0
    r.lpush("queue:nostamp", '{"class":"X","args":[],"jid":"a"}')
    assert Queue("nostamp", config=config).latency == 0.0
    r.lpush("queue:bad", "not json at all")
    assert Queue("bad", config=config).latency == 0.0


def test_pause_and_unpause_use_the_paused_set(config: Config, r: redis.Redis) -> None:
    queue = Queue("mail", config=config)
    assert not queue.paused
    queue.pause()
    queue.pause()  # twice is harmless
    assert r.smembers("paused") == {"mail"}
    assert Queue("mail", config=config).paused
    queue.unpause()
    assert not queue.paused
    assert r.smembers("paused") == set()


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable-fetch", "basic-fetch"])
def test_a_real_launcher_skips_a_paused_queue_until_unpaused(config: Config,
                                                             reliable: bool) -> None:
    config = tuned(config, queues=["default", "other"], reliable_fetch=reliable)
    Queue("default", config=config).pause()
    with recording_job() as (job, runs):
        job.set(queue="default").perform_async("held")
        job.set(queue="other").perform_async("free")
        with launched(config):
            wait_for(lambda: ("free",) in runs)
            time.sleep(0.6)  # several fetch rounds after "other" was served
            assert runs == [("free",)]
            assert Queue("default", config=config).size == 1
            Queue("default", config=config).unpause()
            wait_for(lambda: ("held",) in runs)


def test_iteration_is_newest_first_across_pages(config: Config) -> None:
    wurk.Client(config).push_bulk({"class": "X", "args": [[i] for i in range(120)]})
    records = list(Queue(config=config))
    assert [rec.args[0] for rec in records] == list(range(119, -1, -1))
    assert all(isinstance(rec, JobRecord) and rec.queue == "default" for rec in records)


def test_deleting_while_iterating_skips_nothing(config: Config) -> None:
    wurk.Client(config).push_bulk({"class": "X", "args": [[i] for i in range(130)]})
    deleted = sum(rec.delete() for rec in Queue(config=config))
    assert deleted == 130
    assert Queue(config=config).size == 0


def test_find_job_by_jid(config: Config) -> None:
    client = wurk.Client(config)
    jids = [client.push({"class": "X", "args": [i]}) for i in range(60)]
    found = Queue(config=config).find_job(jids[3])
    assert found is not None and found.args == [3]
    assert Queue(config=config).find_job("0" * 24) is None
    with pytest.raises(JobNotFoundError, match="'default'"):
        Queue(config=config).find_job("0" * 24, must_exist=True)


def test_clear_unlinks_the_list_and_forgets_the_name(config: Config, r: redis.Redis) -> None:
    wurk.Client(config).push({"class": "X", "args": [], "queue": "mail"})
    r.sadd("queues", "default")
    Queue("mail", config=config).clear()
    assert not r.exists("queue:mail")
    assert r.smembers("queues") == {"default"}
    with pytest.raises(UnknownQueueError):
        Queue.get("mail", must_exist=True, config=config)


def test_record_reads_a_ruby_6_4_entry(config: Config, r: redis.Redis) -> None:
    r.lpush("queue:default", RUBY_JOB)
    rec = next(iter(Queue(config=config)))
    assert rec.value == RUBY_JOB.encode()
    assert (rec.jid, rec.klass, rec.class_name) == ("f24f20b2e4a09e8a29747db5", "WurkEcho",
                                                    "WurkEcho")
    assert rec.args == [1, "two", {"three": 3}]
    assert rec.queue == "default"
    assert rec.enqueued_at == 1796022177.8190498
    assert rec.created_at == 1796022177.8188896
    assert rec["retry"] is True
    assert not rec.has_error


def test_record_created_at_in_ms_and_latency(config: Config) -> None:
    now = time.time()
    rec = JobRecord(job_json(created_at=int((now - 5) * 1000), enqueued_at=now - 2.0),
                    config=config)
    assert rec.created_at == pytest.approx(now - 5, abs=0.01)
    assert rec.latency == pytest.approx(2.0, abs=0.5)
    assert JobRecord('{"class":"X","args":[]}', config=config).latency == 0.0


def test_record_display_class_unwraps_activejob_and_mailers(config: Config) -> None:
    wrapped = JobRecord(json.dumps({"class": WRAPPER, "wrapped": "HardJob", "queue": "q",
                                    "args": [{"job_class": "HardJob", "arguments": [1, 2]}]}),
                        config=config)
    assert (wrapped.klass, wrapped.class_name) == ("HardJob", WRAPPER)
    assert wrapped.display_args == [1, 2]
    mailer = JobRecord(json.dumps({"class": WRAPPER, "wrapped": "ActionMailer::MailDeliveryJob",
                                   "args": [{"arguments": ["UserMailer", "welcome", "now"]}]}),
                       config=config)
    assert mailer.klass == "UserMailer#welcome"
    named = JobRecord('{"class":"X","display_class":"Shown","args":[1,"secret"],"encrypt":true}',
                      config=config)
    assert named.klass == "Shown"
    assert named.display_args == [1, "[encrypted data]"]


@pytest.mark.parametrize("garbage", ["not json at all", "[" * 100_000])
def test_record_tolerates_malformed_json_and_still_deletes(config: Config, r: redis.Redis,
                                                           garbage: str) -> None:
    r.lpush("queue:default", garbage, RUBY_JOB)
    records = list(Queue(config=config))
    bad = next(rec for rec in records if not rec.valid)
    assert bad.args == [garbage]
    assert bad.jid is None and bad.klass is None and bad.item == {}
    assert bad.delete()
    assert r.lrange("queue:default", 0, -1) == [RUBY_JOB]


def test_record_error_fields_and_backtrace_in_both_base64_forms(config: Config) -> None:
    lines = ["app.rb:3:in `perform'", "lib/x.rb:9:in `call'"]
    packed = encode_backtrace(lines)
    ruby_style = "\n".join(packed[i:i + 60] for i in range(0, len(packed), 60)) + "\n"
    for encoded in (packed, ruby_style):
        rec = JobRecord(job_json(error_class="RuntimeError", error_message="boom",
                                 failed_at=1796022180.5, retried_at=1796022190000,
                                 retry_count=2, error_backtrace=encoded), config=config)
        assert rec.has_error and rec.error_class == "RuntimeError"
        assert rec.error_message == "boom"
        assert (rec.failed_at, rec.retried_at) == (1796022180.5, 1796022190.0)
        assert rec.retry_count == 2
        assert rec.error_backtrace == lines
    assert JobRecord(job_json(error_backtrace="!!!"), config=config).error_backtrace is None


def test_delete_removes_exactly_one_identical_copy(config: Config, r: redis.Redis) -> None:
    r.lpush("queue:default", RUBY_JOB, RUBY_JOB)
    rec = next(iter(Queue(config=config)))
    assert rec.delete()
    assert r.llen("queue:default") == 1


def test_delete_of_a_job_already_taken_reports_false(config: Config, r: redis.Redis) -> None:
    r.lpush("queue:default", RUBY_JOB)
    rec = next(iter(Queue(config=config)))
    r.delete("queue:default")
    assert rec.delete() is False


def test_iteration_and_latency_see_jobs_pushed_while_a_launcher_runs(config: Config) -> None:
    release = threading.Event()
    with recording_job(block=release) as (job, runs), launched(config):
        total = config.concurrency + 10
        for i in range(total):
            job.perform_async(i)
        wait_for(lambda: len(runs) == config.concurrency)
        waiting = list(Queue(config=config))
        # Newest first, oldest taken: what is left is the newest jobs, in order.
        # (Reliable fetch may have claimed up to half the concurrency ahead.)
        args = [rec.args[0] for rec in waiting]
        assert len(args) >= total - config.concurrency - config.concurrency // 2
        assert args == list(range(total - 1, total - 1 - len(args), -1))
        assert Queue(config=config).latency > 0
        release.set()
        wait_for(lambda: Queue(config=config).size == 0)

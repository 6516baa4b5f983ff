"""wurk.contrib.sentry: failures reported through a capturing Transport.

Events are read from the SDK's transport interface: a Transport subclass
that keeps each envelope's event in this process, and one that a real
``wurk run`` child uses to write its events to a file.
"""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport
from tuning import tuned
from waiting import wait_for

import wurk
from wurk.api.errors import JobKilledError
from wurk.contrib import sentry as wsentry
from wurk.push.client import Client
from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]
Events = list[dict[str, Any]]


class Capture(Transport):
    """Keeps the event of every envelope: the SDK's own seam for a test transport."""

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            with LOCK:
                KEPT.append(event)


LOCK = threading.Lock()
KEPT: Events = []


@pytest.fixture
def events() -> Iterator[Events]:
    KEPT.clear()
    sentry_sdk.init(dsn="http://key@localhost/1", transport=Capture,
                    default_integrations=False)
    yield KEPT
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def raise_boom(value: Any, *rest: Any) -> None:
    sentry_sdk.add_breadcrumb(message=f"about to fail on {value}")
    raise ValueError(f"boom {value}")


def one_for(events: Events, jid: str) -> dict[str, Any]:
    [event] = [e for e in events if e["tags"].get("wurk_jid") == jid]
    return event


# -- report="every" --------------------------------------------------------------------------


def test_every_failure_is_an_event_with_the_job_on_it(
        config: Config, events: Events, define: Define, launch: Launch) -> None:
    wsentry.instrument(config, send_args=True)
    job = define(raise_boom, retry=5)
    client = Client(config)
    first = client.push({"class": job.name, "args": ["first"], "queue": "mail"})
    again = client.push({"class": job.name, "args": ["again"], "retry_count": 2,
                         "queue": "mail"})
    config = tuned(config, queues=["mail"])
    launch()
    wait_for(lambda: len(events) == 2, timeout=10)
    event = one_for(events, str(first))
    assert event["tags"] == {"wurk_job_class": job.name, "wurk_queue": "mail",
                             "wurk_jid": first}
    assert event["transaction"] == job.name
    assert event["transaction_info"] == {"source": "task"}
    [exception] = event["exception"]["values"]
    assert exception["type"] == "ValueError" and exception["value"] == "boom first"
    assert exception["mechanism"] == {"type": "wurk", "handled": False}
    job_info = event["extra"]["wurk-job"]
    assert job_info["args"] == ["first"] and job_info["retry_count"] is None
    assert job_info["class"] == job.name and job_info["queue"] == "mail"
    assert [b["message"] for b in event["breadcrumbs"]["values"]] == ["about to fail on first"]
    later = one_for(events, str(again))
    assert later["extra"]["wurk-job"]["retry_count"] == 2
    # Each job's own breadcrumbs: the first run's did not leak into the second.
    assert [b["message"] for b in later["breadcrumbs"]["values"]] == ["about to fail on again"]


def test_a_class_no_module_registered_is_reported_from_its_payload(
        config: Config, events: Events, r: redis.Redis, launch: Launch) -> None:
    wsentry.instrument(config)
    jid = Client(config).push({"class": "NoSuchJob", "args": [1], "retry": False})
    launch()
    wait_for(lambda: events, timeout=10)
    event = one_for(events, str(jid))
    assert event["tags"]["wurk_job_class"] == "NoSuchJob"
    assert event["exception"]["values"][0]["type"] == "UnknownJobError"
    assert event["extra"]["wurk-job"]["args"] == "[Filtered]"


def test_a_job_a_limiter_reschedules_makes_no_event(
        config: Config, events: Events, r: redis.Redis, define: Define,
        launch: Launch) -> None:
    from wurk.limiter import OverLimit, concurrent

    limiter = concurrent("sentry-test", 1, reschedule=5)

    def over() -> None:
        raise OverLimit(limiter)

    wsentry.instrument(config)
    define(over).perform_async()
    launch()
    # Error handlers would run before the settle: once the reschedule is written, none will.
    wait_for(lambda: r.zcard("schedule") == 1, timeout=10)
    assert events == []


# -- report="final" --------------------------------------------------------------------------


def test_final_reports_only_the_failure_that_ends_a_job(
        config: Config, events: Events, r: redis.Redis, define: Define,
        launch: Launch) -> None:
    wsentry.instrument(config, report="final")
    retried = define(raise_boom, retry=1)
    dropped = define(raise_boom, retry=False)
    client = Client(config)
    will_retry = client.push({"class": retried.name, "args": ["retry me"], "retry": 1})
    will_die = client.push({"class": retried.name, "args": ["last"], "retry": 1,
                            "retry_count": 0})
    will_drop = client.push({"class": dropped.name, "args": ["drop"], "retry": False})
    launch()
    # Death handlers run before the settle: once the retry is written, any event it made is here.
    wait_for(lambda: r.zcard("retry") == 1 and r.zcard("dead") == 1 and len(events) >= 2,
             timeout=10)
    assert sorted(e["tags"]["wurk_jid"] for e in events) == sorted([str(will_die),
                                                                     str(will_drop)])
    assert json.loads(r.zrange("retry", 0, -1)[0])["jid"] == will_retry
    assert one_for(events, str(will_die))["extra"]["wurk-job"]["retry_count"] == 0


def test_a_kill_from_the_api_is_not_reported(events: Events) -> None:
    wsentry.DeathReporter()({"class": "X", "jid": "j", "args": []},
                            JobKilledError("Job killed by API"))
    wsentry.DeathReporter()({"class": "X", "jid": "k", "args": []}, ValueError("real"))
    assert [e["tags"]["wurk_jid"] for e in events] == ["k"]


# -- the arguments -----------------------------------------------------------------------------


def _scrub_fails(args: list[Any]) -> Any:
    raise KeyError("scrubber bug")


@pytest.mark.parametrize(("send_args", "sent"), [
    (None, "[Filtered]"),
    (False, "[Filtered]"),
    (True, [1, {"password": "hunter2"}]),
    (lambda args: [args[0], "[scrubbed]"], [1, "[scrubbed]"]),
    (_scrub_fails, "[Filtered]"),
])
def test_arguments_go_only_as_the_option_says(events: Events, send_args: Any,
                                              sent: Any) -> None:
    payload = {"class": "X", "jid": "j", "args": [1, {"password": "hunter2"}]}
    wsentry.ErrorReporter(send_args)(ValueError("no"), {"job": payload, "queue": "q"})
    [event] = events
    assert event["extra"]["wurk-job"]["args"] == sent


@pytest.mark.parametrize(("collection", "sent"), [
    ({"queues": True}, [7]), ({"queues": False}, "[Filtered]"), ({}, [7]),
])
def test_by_default_arguments_follow_the_sdks_data_collection(
        events: Events, collection: dict[str, Any], sent: Any) -> None:
    sentry_sdk.init(dsn="http://key@localhost/1", transport=Capture,
                    default_integrations=False, data_collection=collection)
    wsentry.ErrorReporter()(ValueError("no"), {"job": {"class": "X", "args": [7]},
                                                "queue": "q"})
    assert events[0]["extra"]["wurk-job"]["args"] == sent


def test_instrument_is_idempotent_and_checks_its_options(config: Config) -> None:
    wsentry.instrument(config)
    wsentry.instrument(config, report="final")
    assert [type(h) for h in config.error_handlers] == [wsentry.ErrorReporter]
    assert config.death_handlers == []
    assert [type(m) for m in config.server_middleware] == [wsentry.SentryMiddleware]
    # Swarm children leave by os._exit: the SDK's queue is flushed by this hook.
    assert config.on_shutdown == [wsentry.flush_events]
    with pytest.raises(ValueError, match="report must be one of every, final"):
        wsentry.instrument(Config(), report="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="send_args must be None, a bool or a function"):
        wsentry.instrument(Config(), send_args="yes")  # type: ignore[arg-type]


# -- a real worker process ------------------------------------------------------------------

CHILD_JOBS = textwrap.dedent("""
    import json
    import os

    import sentry_sdk
    from sentry_sdk.transport import Transport

    import wurk
    from wurk.contrib.sentry import instrument


    class FileTransport(Transport):
        def capture_envelope(self, envelope):
            event = envelope.get_event()
            if event is not None:
                with open(os.environ["EVENTS_FILE"], "a") as fh:
                    fh.write(json.dumps(event, default=str) + "\\n")


    sentry_sdk.init(dsn="http://key@localhost/1", transport=FileTransport)
    instrument(wurk.default_config(), report="final",
               send_args=lambda args: [len(args)])


    @wurk.job(name="sentry_boom", retry=False)
    def boom(value, other):
        raise ValueError(f"boom {value}")
""")


def test_a_wurk_run_process_reports_a_dead_job(
        r: redis.Redis, jobs_dir: Path, spawn: Callable[..., cli_workers.Worker]) -> None:
    (jobs_dir / "sentryjobs.py").write_text(CHILD_JOBS)
    events_file = jobs_dir / "events.jsonl"
    # As Ruby would push it: retry false in the payload, so the first failure is final.
    jid = "0123456789abcdef01234567"
    r.lpush("queue:default", json.dumps({"class": "sentry_boom", "args": ["secret", "more"],
                                         "jid": jid, "queue": "default", "retry": False}))
    worker = spawn("-r", "sentryjobs", EVENTS_FILE=str(events_file))

    def reported() -> list[dict[str, Any]] | None:
        assert worker.alive(), worker.stderr()
        if not events_file.exists():
            return None
        return [json.loads(line) for line in events_file.read_text().splitlines()] or None

    [event] = wait_for(reported, timeout=30)
    assert event["tags"] == {"wurk_job_class": "sentry_boom", "wurk_queue": "default",
                             "wurk_jid": jid}
    assert event["extra"]["wurk-job"]["args"] == [2]
    assert event["exception"]["values"][0]["value"] == "boom secret"


def test_the_how_to_example_runs(redis_server: Any, r: redis.Redis, events: Events,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from wurk.redis.runtime import close_runtime
    from wurk.settings import config as settings

    # The example installs its own default Config: the next tests get theirs back.
    monkeypatch.setattr(settings, "_default", settings._default)
    monkeypatch.setattr(wurk.Client, "_default", None)
    from examples.sentry_reporting import main

    monkeypatch.setenv("SENTRY_DSN", "http://key@localhost/1")
    # The SDK's default integrations stay off here: they would patch this whole test process.
    main(redis_server.url, transport=Capture, default_integrations=False)
    [event] = KEPT
    assert event["tags"]["wurk_job_class"] == "charge_card"
    assert event["extra"]["wurk-job"]["args"] == [1234, "[Filtered]"]
    assert [b["message"] for b in event["breadcrumbs"]["values"]] == ["charging order 1234"]
    wurk.registry.discard("charge_card")
    close_runtime(settings._default)


def test_the_how_to_page_shows_the_example_file_whole() -> None:
    root = Path(__file__).resolve().parent.parent
    example = (root / "examples" / "sentry_reporting.py").read_text()
    assert f"```python\n{example}```" in (root / "docs" / "how-to" / "sentry.md").read_text()

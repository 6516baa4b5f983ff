"""wurk.contrib.opentelemetry: producer and consumer spans joined through the payload.

The spans are read from the SDK's in-memory exporter in this process, and
from a JSON-lines file that a real ``wurk run`` child's exporter writes.
"""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import cli_workers
import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from waiting import wait_for

import wurk
from wurk.contrib import opentelemetry as wotel
from wurk.push.client import Client
from wurk.push.job import JobFunction
from wurk.runtime.launcher import Launcher
from wurk.settings.config import Config

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
Define = Callable[..., JobFunction[..., Any]]
Launch = Callable[..., Launcher]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    yield tp
    tp.shutdown()


@pytest.fixture
def traced(config: Config, provider: TracerProvider) -> Config:
    return wotel.instrument(config, tracer_provider=provider)


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def by_jid(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})["messaging.message.id"]): s for s in spans}


# -- across processes: a push here, a run in a real `wurk run` -------------------------------

CHILD_JOBS = textwrap.dedent("""
    import json
    import os

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    import wurk
    from wurk.contrib.opentelemetry import instrument


    class FileExporter(SpanExporter):
        def export(self, spans):
            with open(os.environ["SPANS_FILE"], "a") as fh:
                for span in spans:
                    fh.write(json.dumps({
                        "name": span.name, "kind": span.kind.name,
                        "trace_id": span.context.trace_id, "span_id": span.context.span_id,
                        "parent": span.parent.span_id if span.parent else None,
                        "attributes": dict(span.attributes),
                        "status": span.status.status_code.name,
                        "events": [[e.name, dict(e.attributes)] for e in span.events],
                    }) + "\\n")
            return SpanExportResult.SUCCESS


    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    instrument(wurk.default_config(), tracer_provider=provider)


    @wurk.job(name="otel_ok")
    def ok(value):
        pass


    @wurk.job(name="otel_boom", retry=False)
    def boom(value):
        raise ValueError(f"boom {value}")
""")


def test_a_push_here_and_a_run_in_a_wurk_run_process_share_one_trace(
        traced: Config, exporter: InMemorySpanExporter, jobs_dir: Path,
        spawn: Callable[..., cli_workers.Worker]) -> None:
    (jobs_dir / "oteljobs.py").write_text(CHILD_JOBS)
    spans_file = jobs_dir / "spans.jsonl"
    client = Client(traced)
    ok_jid = client.push({"class": "otel_ok", "args": [1], "retry_count": 3})
    boom_jid = client.push({"class": "otel_boom", "args": [2], "queue": "critical"})
    worker = spawn("-r", "oteljobs", "-q", "default", "-q", "critical",
                   SPANS_FILE=str(spans_file))

    def consumed() -> dict[str, dict[str, Any]] | None:
        assert worker.alive(), worker.stderr()
        if not spans_file.exists():
            return None
        rows = [json.loads(line) for line in spans_file.read_text().splitlines()]
        found = {row["attributes"]["messaging.message.id"]: row for row in rows}
        return found if len(found) == 2 else None

    child = wait_for(consumed, timeout=15)
    producers = by_jid(named(exporter, "publish"))
    for jid, queue in ((ok_jid, "default"), (boom_jid, "critical")):
        sent, ran = producers[str(jid)], child[str(jid)]
        assert sent.kind == SpanKind.PRODUCER and ran["kind"] == "CONSUMER"
        assert ran["trace_id"] == sent.context.trace_id
        assert ran["parent"] == sent.context.span_id
        assert ran["name"] == f"process {queue}"
        assert ran["attributes"]["messaging.system"] == "sidekiq"
        assert ran["attributes"]["messaging.destination.name"] == queue
        assert ran["attributes"]["messaging.operation.type"] == "process"
    assert child[str(ok_jid)]["status"] == "UNSET"
    assert child[str(ok_jid)]["attributes"]["messaging.sidekiq.retry_count"] == 3
    assert child[str(ok_jid)]["attributes"]["messaging.sidekiq.job_class"] == "otel_ok"
    failed = child[str(boom_jid)]
    assert failed["status"] == "ERROR"
    assert failed["attributes"]["error.type"] == "ValueError"
    [(event, attrs)] = failed["events"]
    assert event == "exception" and attrs["exception.message"] == "boom 2"


# -- in process: the producer side ------------------------------------------------------------


def test_the_producer_span_writes_the_w3c_fields_and_messaging_attributes(
        traced: Config, r: redis.Redis, exporter: InMemorySpanExporter) -> None:
    jid = Client(traced).push({"class": "Remote", "args": [], "queue": "mail"})
    [span] = named(exporter, "publish")
    written = json.loads(r.lrange("queue:mail", 0, -1)[0])
    trace_id, span_id = f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"
    assert written["traceparent"].split("-")[1:3] == [trace_id, span_id]
    assert span.name == "publish mail" and span.kind == SpanKind.PRODUCER
    assert dict(span.attributes or {}) == {
        "messaging.system": "sidekiq", "messaging.destination.name": "mail",
        "messaging.operation.name": "publish", "messaging.operation.type": "create",
        "messaging.operation": "publish", "messaging.sidekiq.job_class": "Remote",
        "messaging.message.id": jid}


def test_a_bulk_push_gives_each_job_its_own_producer_span_and_parent(
        traced: Config, exporter: InMemorySpanExporter, define: Define, launch: Launch) -> None:
    seen: list[int] = []
    job = define(seen.append)
    jids = job.perform_bulk([[1], [2], [3]])
    launch()
    wait_for(lambda: len(named(exporter, "process")) == 3)
    producers, consumers = by_jid(named(exporter, "publish")), by_jid(named(exporter, "process"))
    assert sorted(producers) == sorted(jids) == sorted(consumers)
    assert len({s.context.span_id for s in producers.values()}) == 3
    for jid in jids:
        assert consumers[jid].parent is not None
        assert consumers[jid].parent.span_id == producers[jid].context.span_id


def test_a_failing_push_marks_its_span_and_a_repush_links_the_old_context(
        config: Config, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    def refuse(job_class: str, payload: dict[str, Any], queue: str, redis: Any,
               call_next: Callable[[], Any]) -> Any:
        raise PermissionError("no pushes today")

    failing = Client(config, middleware=[wotel.ProducerMiddleware(provider), refuse])
    with pytest.raises(PermissionError):
        failing.push({"class": "Remote", "args": []})
    [span] = named(exporter, "publish")
    assert span.status.status_code == StatusCode.ERROR
    old = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    working = Client(config, middleware=[wotel.ProducerMiddleware(provider)])
    working.push({"class": "Remote", "args": [], "traceparent": old, "tracestate": "a=b"})
    repushed = named(exporter, "publish")[-1]
    assert [f"{link.context.span_id:016x}" for link in repushed.links] == ["b7ad6b7169203331"]


# -- in process: the consumer side ------------------------------------------------------------


def test_link_propagation_starts_a_new_trace_linked_to_the_scheduled_push(
        config: Config, provider: TracerProvider, exporter: InMemorySpanExporter,
        define: Define, launch: Launch) -> None:
    wotel.instrument(config, tracer_provider=provider, propagation="link")
    done = threading.Event()
    job = define(done.set)
    job.perform_in(0.1)
    launch()
    assert done.wait(10)
    wait_for(lambda: named(exporter, "process"))
    [sent], [ran] = named(exporter, "publish"), named(exporter, "process")
    assert (sent.attributes or {})["messaging.sidekiq.scheduled"] is True
    assert ran.parent is None
    assert ran.context.trace_id != sent.context.trace_id
    assert [link.context.span_id for link in ran.links] == [sent.context.span_id]


def test_a_retry_runs_under_the_same_push_span_with_its_retry_count(
        traced: Config, r: redis.Redis, exporter: InMemorySpanExporter, define: Define,
        launch: Launch) -> None:
    runs: list[int] = []

    def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("first run fails")

    job = define(flaky)
    job.perform_async()
    launch()
    [raw] = wait_for(lambda: r.zrange("retry", 0, -1), timeout=10)
    r.zadd("retry", {raw: 0})  # due now: the scheduler moves it, as it would in 15 s or more
    wait_for(lambda: len(named(exporter, "process")) == 2, timeout=10)
    [sent] = named(exporter, "publish")
    first, second = named(exporter, "process")
    assert first.parent is not None and second.parent is not None
    assert first.parent.span_id == second.parent.span_id == sent.context.span_id
    assert first.status.status_code == StatusCode.ERROR
    assert second.status.status_code == StatusCode.UNSET
    assert "messaging.sidekiq.retry_count" not in (first.attributes or {})
    assert (second.attributes or {})["messaging.sidekiq.retry_count"] == 0


def test_a_push_from_inside_a_job_is_a_child_of_its_run(
        traced: Config, exporter: InMemorySpanExporter, define: Define, launch: Launch) -> None:
    inner = define(lambda: None)
    outer = define(inner.perform_async)
    outer_jid = outer.perform_async()
    launch()
    wait_for(lambda: len(named(exporter, "process")) == 2)
    runs = by_jid(named(exporter, "process"))
    sends = [s for s in named(exporter, "publish") if s.parent is not None]
    [nested] = sends
    assert nested.parent is not None
    assert nested.parent.span_id == runs[str(outer_jid)].context.span_id
    assert len({s.context.trace_id for s in exporter.get_finished_spans()}) == 1


@pytest.mark.parametrize("carried", [
    12345, ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"], "garbage",
    "00-" + "f" * 100_000, None,
])
def test_a_payload_with_an_unusable_context_still_runs_in_a_root_span(
        config: Config, provider: TracerProvider, exporter: InMemorySpanExporter,
        carried: Any) -> None:
    payload: dict[str, Any] = {"class": "X", "jid": "j", "args": [], "traceparent": carried,
                               "tracestate": {"not": "a string"}}
    consumer = wotel.ConsumerMiddleware(provider)
    assert consumer(payload, "default", lambda: "ran") == "ran"
    [span] = named(exporter, "process")
    assert span.parent is None


def test_a_child_run_sees_the_pushers_baggage_and_a_linked_run_does_not(
        config: Config, provider: TracerProvider) -> None:
    from opentelemetry import baggage, context

    payload: dict[str, Any] = {"class": "X", "jid": "j", "args": []}
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        wotel.ProducerMiddleware(provider)("X", payload, "default", None, lambda: None)
    finally:
        context.detach(token)
    assert payload["baggage"] == "tenant=acme"
    seen = []
    for propagation in ("child", "link"):
        consumer = wotel.ConsumerMiddleware(provider, propagation)  # type: ignore[arg-type]
        consumer(payload, "default", lambda: seen.append(baggage.get_baggage("tenant")))
    assert seen == ["acme", None]
    assert baggage.get_baggage("tenant") is None  # nothing left attached after the run


def test_attributes_from_a_hostile_payload_are_bounded() -> None:
    attrs = wotel.attributes({"class": "C" * 50_000, "jid": "j" * 50_000,
                              "retry_count": 10**30, "wrapped": 7}, "default", "process")
    assert len(attrs["messaging.sidekiq.job_class"]) == len(attrs["messaging.message.id"]) == 1000
    assert "messaging.sidekiq.retry_count" not in attrs
    odd = wotel.attributes({"class": None, "jid": 5, "retry_count": True}, "q", "process")
    assert odd["messaging.sidekiq.job_class"] == "None"
    assert "messaging.message.id" not in odd and "messaging.sidekiq.retry_count" not in odd


def test_a_reschedule_by_a_limiter_is_not_an_error(
        config: Config, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    from wurk.limiter import OverLimit, concurrent

    limiter = concurrent("otel-test", 1, reschedule=5)
    consumer = wotel.ConsumerMiddleware(provider)

    def over() -> None:
        raise OverLimit(limiter)

    with pytest.raises(OverLimit):
        consumer({"class": "X", "jid": "j", "args": []}, "default", over)
    [span] = named(exporter, "process")
    assert span.status.status_code == StatusCode.UNSET
    assert [e.name for e in span.events] == ["wurk.over_limit"]


def test_instrument_is_idempotent_and_checks_its_options(config: Config) -> None:
    def mine(job: Mapping[str, Any], queue: str, call_next: Callable[[], Any]) -> Any:
        return call_next()

    config.server_middleware.append(mine)
    wotel.instrument(config)
    wotel.instrument(config)
    assert [type(mw) for mw in config.client_middleware] == [wotel.ProducerMiddleware]
    assert config.server_middleware[1:] == [mine]
    assert isinstance(config.server_middleware[0], wotel.ConsumerMiddleware)
    with pytest.raises(ValueError, match="propagation must be one of child, link"):
        wotel.instrument(Config(), propagation="sibling")  # type: ignore[arg-type]


def test_the_shutdown_hook_exports_what_a_batch_processor_still_holds(config: Config) -> None:
    held = InMemorySpanExporter()
    provider = TracerProvider()
    # A batch processor that would wait a minute before exporting on its own.
    provider.add_span_processor(BatchSpanProcessor(held, schedule_delay_millis=60_000))
    try:
        wotel.instrument(config, tracer_provider=provider)
        wotel.instrument(config, tracer_provider=provider)
        hooks = [h for h in config.on_shutdown if isinstance(h, wotel.FlushSpans)]
        assert len(hooks) == 1
        with provider.get_tracer("test").start_as_current_span("last words"):
            pass
        assert held.get_finished_spans() == ()
        hooks[0]()  # what a swarm child calls before os._exit
        assert [s.name for s in held.get_finished_spans()] == ["last words"]
    finally:
        provider.shutdown()


@pytest.fixture
def default_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An example installs its own default Config: give the next tests theirs back."""
    from wurk.redis.runtime import close_runtime
    from wurk.settings import config as settings

    monkeypatch.setattr(settings, "_default", settings._default)
    monkeypatch.setattr(wurk.Client, "_default", None)
    yield
    if settings._default is not None:
        close_runtime(settings._default)


def test_the_how_to_example_runs(redis_server: Any, r: redis.Redis,
                                 default_restored: None) -> None:
    from wurk.runtime.loading import load_modules

    example = Path(__file__).resolve().parent.parent / "examples" / "otel_tracing.py"
    [module] = load_modules([str(example)])
    # The example waits (up to 20 s) for its job: both spans say it ran.
    spans = module.main(redis_server.url)
    assert {s.name for s in spans} == {"publish default", "process default"}
    assert len({s.context.trace_id for s in spans}) == 1
    wurk.registry.discard("send_welcome")


def test_the_how_to_page_shows_the_example_file_whole() -> None:
    root = Path(__file__).resolve().parent.parent
    example = (root / "examples" / "otel_tracing.py").read_text()
    assert f"```python\n{example}```" in (root / "docs" / "how-to" / "opentelemetry.md").read_text()

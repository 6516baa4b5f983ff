"""The integrations under a real ``wurk-swarm``: instrumented once at import in
the parent, they reach every forked child, whose slot Config is its own."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import swarms
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from waiting import wait_for

from wurk.contrib import opentelemetry as wotel
from wurk.push.client import Client
from wurk.settings.config import Config

launch = swarms.launch

APP = textwrap.dedent("""
    import json
    import os

    import sentry_sdk
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from sentry_sdk.transport import Transport

    import wurk
    from wurk.contrib import opentelemetry, sentry

    OUT = os.environ["OUT_DIR"]


    class Spans(SpanExporter):
        def export(self, spans):
            with open(os.path.join(OUT, "spans.jsonl"), "a") as fh:
                for span in spans:
                    fh.write(json.dumps({
                        "name": span.name, "trace_id": span.context.trace_id,
                        "parent": span.parent.span_id if span.parent else None,
                        "pid": os.getpid(),
                    }) + "\\n")
            return SpanExportResult.SUCCESS


    class Events(Transport):
        def capture_envelope(self, envelope):
            event = envelope.get_event()
            if event is not None:
                with open(os.path.join(OUT, "events.jsonl"), "a") as fh:
                    fh.write(json.dumps({"tags": event["tags"], "pid": os.getpid()}) + "\\n")


    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Spans()))
    opentelemetry.instrument(tracer_provider=provider)
    sentry_sdk.init(dsn="http://key@localhost/1", transport=Events)
    sentry.instrument(report="final")


    @wurk.job(name="traced_fail", retry=False)
    def fail(value):
        raise RuntimeError(f"failed {value}")
""")


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_instrument_without_a_config_reaches_each_swarm_child(
        launch: Callable[..., swarms.SwarmProcess], tmp_path: Path, r: redis.Redis,
        config: Config) -> None:
    (tmp_path / "traced_app.py").write_text(APP)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    wotel.instrument(config, tracer_provider=provider)
    swarm = launch(swarms.slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   require=["traced_app"], env={"OUT_DIR": str(tmp_path)})
    swarm.wait_ready({"alpha": 2})
    jids = [Client(config).push({"class": "traced_fail", "args": [n], "queue": "qa",
                                 "retry": False}) for n in range(6)]
    wait_for(lambda: len(rows(tmp_path / "spans.jsonl")) == 6
             and len(rows(tmp_path / "events.jsonl")) == 6, timeout=20)
    sent = {s.context.trace_id: s.context.span_id for s in exporter.get_finished_spans()}
    ran = rows(tmp_path / "spans.jsonl")
    assert all(sent[row["trace_id"]] == row["parent"] for row in ran)
    assert {row["pid"] for row in ran} <= swarm.child_pids()
    assert sorted(e["tags"]["wurk_jid"] for e in rows(tmp_path / "events.jsonl")) == sorted(
        str(jid) for jid in jids)

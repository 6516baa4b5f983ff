"""Trace wurk jobs with OpenTelemetry: one trace from the push to the run.

Run it against a local Redis (``python -m examples.otel_tracing``): it
pushes one job, runs it in an embedded worker and prints the two spans, the
``publish`` span of the push and the ``process`` span of the run, with the
same trace id. A real application keeps the provider it already has (an
OTLP exporter behind a BatchSpanProcessor) and calls ``instrument`` once,
where it configures wurk: in the module that ``wurk run -r`` loads, and in
the web app that pushes.
"""

from __future__ import annotations

import threading

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import wurk
from wurk.contrib.opentelemetry import instrument
from wurk.runtime.embedded import Embedded

welcomed = threading.Event()


@wurk.job(name="send_welcome")
def send_welcome(user_id: int) -> None:
    welcomed.set()


def main(redis_url: str = "redis://localhost:6379/0") -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = wurk.configure(redis_url=redis_url, fetch_timeout=0.2)
    # Without tracer_provider, the global one (trace.set_tracer_provider) is used.
    instrument(config, tracer_provider=provider)
    worker = Embedded(config).start()
    try:
        send_welcome.perform_async(42)
        welcomed.wait(20)
    finally:
        worker.stop()  # drains: the run's span has ended when this returns
    return list(exporter.get_finished_spans())


if __name__ == "__main__":
    for span in main():
        print(span.name, f"trace={span.context.trace_id:032x}", dict(span.attributes or {}))

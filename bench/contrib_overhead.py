"""What the OpenTelemetry and Sentry integrations add to one push and one run.

    python bench/contrib_overhead.py [--jobs 20000]

No Redis and no worker: it calls the middlewares exactly as wurk's client
and server chains do (``wurk.push.middleware.invoke``,
``wurk.runtime.middleware.invoke``) around a job that does nothing, with the
SDKs configured as an application would (OpenTelemetry's SDK with a span
processor that drops every span after it ends, Sentry with a DSN and a
transport that keeps nothing), and prints microseconds per job for: no
middleware, each integration alone, and both; and, to set those against,
two bare SDK spans with the same attributes (the SDK's own cost).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import sentry_sdk
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from sentry_sdk.transport import Transport

from wurk.contrib import opentelemetry as wotel
from wurk.contrib import sentry as wsentry
from wurk.push import middleware as client_chain
from wurk.runtime import middleware as server_chain


class Drop(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        pass


class Nowhere(Transport):
    def capture_envelope(self, envelope: Any) -> None:
        pass


def payload(n: int) -> dict[str, Any]:
    return {"class": "Bench", "args": [n, "x"], "queue": "default", "jid": f"{n:024x}",
            "retry": True, "created_at": 1.0, "enqueued_at": 1.0}


def per_job(jobs: int, client: Sequence[Any], server: Sequence[Any]) -> float:
    noop: Callable[[], None] = lambda: None  # noqa: E731
    started = time.perf_counter()
    for n in range(jobs):
        job = payload(n)
        client_chain.invoke(client, job, None)
        server_chain.invoke(server, job, "default", noop)
    return (time.perf_counter() - started) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    jobs = parser.parse_args().jobs
    provider = TracerProvider()
    provider.add_span_processor(Drop())
    sentry_sdk.init(dsn="http://key@localhost/1", transport=Nowhere,
                    default_integrations=False)
    otel = ([wotel.ProducerMiddleware(provider)], [wotel.ConsumerMiddleware(provider)])
    sentry = ([], [wsentry.SentryMiddleware()])
    cases = {"none": ([], []), "opentelemetry": otel, "sentry": sentry,
             "both": (otel[0], [*otel[1], *sentry[1]])}
    per_job(1000, *otel)  # warm up
    baseline = per_job(jobs, [], [])
    for name, (client, server) in cases.items():
        took = per_job(jobs, client, server)
        print(f"{name:14s} {took:8.1f} us per push + run   (+{took - baseline:.1f} us)")
    print(f"{'2 bare spans':14s} {bare_spans(provider, jobs):8.1f} us")


def bare_spans(provider: TracerProvider, jobs: int) -> float:
    tracer = provider.get_tracer("bench")
    attrs = wotel.attributes(payload(0), "default", "process")
    started = time.perf_counter()
    for _ in range(jobs):
        for _ in range(2):
            with tracer.start_as_current_span("process default", attributes=attrs):
                pass
    return (time.perf_counter() - started) / jobs * 1e6


if __name__ == "__main__":
    main()

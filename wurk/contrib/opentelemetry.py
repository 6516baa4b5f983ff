"""OpenTelemetry tracing: a producer span for each push, a consumer span for each run.

The trace context travels in the job's payload as top-level ``traceparent``
and ``tracestate`` strings (W3C Trace Context; ``baggage`` too when there is
any): the fields Ruby's opentelemetry-instrumentation-sidekiq writes and
reads, so a job pushed by Ruby and run by wurk (or the reverse) stays in one
trace. Sidekiq ignores and keeps fields it does not know, retries included.

Duties:
1. :class:`ProducerMiddleware` (client middleware): open a PRODUCER span
   ``publish <queue>`` around the rest of the client chain for each job
   (each job of a bulk push too: each job gets its own context to carry),
   and write the current context into the payload through the global
   propagator. A payload that already carried a context (a retry from the
   API) is linked from the new span.
2. :class:`ConsumerMiddleware` (server middleware): read that context back
   (the payload is untrusted: only short strings are read, anything else is
   no context) and run the job inside a CONSUMER span ``process <queue>``,
   child of the producer's span (``propagation="child"``, the default) or
   the root of a new trace linked to it (``"link"``). A failure is recorded
   on the span (``record_exception``, status ERROR, ``error.type``); a
   limiter's reschedule is not a failure, only an event.
3. Messaging semantic-convention attributes on both spans.
4. :func:`instrument`: add both middlewares to a Config, once; without a
   Config, to the default one and each later default (``wurk.contrib._follow``).
5. Import OpenTelemetry only here; without it, an ImportError that names
   the ``wurk[opentelemetry]`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from wurk.core.validate import is_whole

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError as missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "wurk.contrib.opentelemetry needs the OpenTelemetry API: "
        "pip install 'wurk[opentelemetry]'") from missing

from wurk.contrib._follow import each_default
from wurk.limiter.base import reschedulable
from wurk.settings.config import Config
from wurk.version import __version__

Propagation = Literal["child", "link"]
PROPAGATIONS: tuple[str, ...] = ("child", "link")
# Sidekiq's name: the wire protocol and the queues are Sidekiq's, and Ruby's
# instrumentation reports the same jobs under it (see the how-to).
SYSTEM = "sidekiq"
# W3C caps traceparent at 55 characters and tracestate at 32 entries of at
# most 256 each; anything longer in a payload is not a context we wrote.
MAX_FIELD = 8192
# Attributes come from an untrusted payload: strings are cut, and a count
# outside int64 (what OTLP carries) is left out.
MAX_TEXT = 1000
MAX_COUNT = 2**63 - 1
SCOPE = "wurk.contrib.opentelemetry"


class _PayloadGetter(Getter[Mapping[str, Any]]):
    """Reads propagation fields from a payload: short strings only."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if isinstance(value, str) and len(value) <= MAX_FIELD:
            return [value]
        return None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [key for key in carrier if isinstance(key, str)]


GETTER = _PayloadGetter()


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    # With no provider, the global one: a proxy until the app sets it, so
    # instrumenting before the SDK is configured still works.
    return trace.get_tracer(SCOPE, __version__, tracer_provider=provider)


def _job_class(payload: Mapping[str, Any]) -> str:
    """The class to report: an ActiveJob wrapper's ``wrapped`` when present (as Ruby does)."""
    wrapped = payload.get("wrapped")
    name = wrapped if isinstance(wrapped, str) else str(payload.get("class"))
    return name[:MAX_TEXT]


def attributes(payload: Mapping[str, Any], queue: str, operation: str) -> dict[str, Any]:
    """The messaging attributes for one job; ``operation`` is "publish" or "process"."""
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.name": operation,
        # The span covers the job's creation, not the Redis write, which the
        # client does after the chain: semconv's "create" (one span per message).
        "messaging.operation.type": "create" if operation == "publish" else "process",
        # The older attribute, still what Ruby's Sidekiq instrumentation sets.
        "messaging.operation": operation,
        "messaging.sidekiq.job_class": _job_class(payload),
    }
    jid = payload.get("jid")
    if isinstance(jid, str):
        attrs["messaging.message.id"] = jid[:MAX_TEXT]
    count = payload.get("retry_count")
    if is_whole(count) and abs(count) <= MAX_COUNT:
        attrs["messaging.sidekiq.retry_count"] = count
    return attrs


def _linked(payload: Mapping[str, Any]) -> list[Link]:
    """A link to the context a payload already carries, if it carries a valid one."""
    carried = trace.get_current_span(propagate.extract(payload, getter=GETTER))
    span_context = carried.get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


@contextmanager
def _attached(context: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def _failed(span: trace.Span, exc: BaseException, payload: Mapping[str, Any]) -> None:
    if isinstance(payload, dict) and reschedulable(exc, payload):
        span.add_event("wurk.over_limit", {"wurk.limiter": str(exc)[:200]})
        return
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))


class ProducerMiddleware:
    """Client middleware: a PRODUCER span per job, its context written into the payload."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = _tracer(tracer_provider)

    def __call__(self, job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], Any]) -> Any:
        attrs = attributes(payload, queue, "publish")
        if "at" in payload:
            attrs["messaging.sidekiq.scheduled"] = True
        with self.tracer.start_as_current_span(
                f"publish {queue}", kind=SpanKind.PRODUCER, attributes=attrs,
                links=_linked(payload)) as span:
            for key in propagate.get_global_textmap().fields:
                payload.pop(key, None)  # an old tracestate must not outlive its traceparent
            propagate.inject(payload)
            try:
                return call_next()
            except BaseException as exc:
                _failed(span, exc, payload)
                raise


class ConsumerMiddleware:
    """Server middleware: a CONSUMER span around each run, joined to its producer."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 propagation: Propagation = "child") -> None:
        if propagation not in PROPAGATIONS:
            raise ValueError(f"propagation must be one of {', '.join(PROPAGATIONS)}, "
                             f"not {propagation!r}")
        self.tracer = _tracer(tracer_provider)
        self.propagation = propagation

    def __call__(self, payload: Mapping[str, Any], queue: str,
                 call_next: Callable[[], Any]) -> Any:
        carried = propagate.extract(payload, getter=GETTER)
        links: list[Link] = []
        if self.propagation == "link":
            span_context = trace.get_current_span(carried).get_span_context()
            links = [Link(span_context)] if span_context.is_valid else []
            carried = otel_context.Context()  # a new trace: no parent, no baggage
        # Attached first, so the job sees the producer's baggage as well as the span.
        with _attached(carried), self.tracer.start_as_current_span(
                f"process {queue}", kind=SpanKind.CONSUMER,
                attributes=attributes(payload, queue, "process"), links=links,
                record_exception=False, set_status_on_exception=False) as span:
            try:
                return call_next()
            except BaseException as exc:
                _failed(span, exc, payload)
                raise


# How long a flush at exit may wait for the exporter.
FLUSH_MS = 2000


def instrument(config: Config | None = None, *,
               tracer_provider: trace.TracerProvider | None = None,
               propagation: Propagation = "child") -> Config:
    """Trace every push and every run of ``config``; returns it. Calling it again does nothing.

    Without a config: the process's default one, and each one that later
    becomes the default (a swarm child's slot). The producer goes last in
    ``client_middleware`` (it sees the payload as the other middlewares left
    it) and the consumer first in ``server_middleware`` (its span covers the
    other middlewares, and their errors).
    """
    consumer = ConsumerMiddleware(tracer_provider, propagation)  # checks propagation first
    if config is None:
        return each_default(lambda default: instrument(
            default, tracer_provider=tracer_provider, propagation=propagation))
    if not any(isinstance(mw, ProducerMiddleware) for mw in config.client_middleware):
        config.client_middleware.append(ProducerMiddleware(tracer_provider))
    if not any(isinstance(mw, ConsumerMiddleware) for mw in config.server_middleware):
        config.server_middleware.insert(0, consumer)
    if not any(isinstance(hook, FlushSpans) for hook in config.on_shutdown):
        config.on_shutdown.append(FlushSpans(tracer_provider))
    return config


class FlushSpans:
    """An ``on_shutdown`` hook: export the spans a batch processor still holds.

    A swarm child leaves by ``os._exit``, which skips the SDK's own flush at
    exit; without this its last spans would be lost.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None) -> None:
        self.tracer_provider = tracer_provider

    def __call__(self) -> None:
        provider = self.tracer_provider or trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)  # the SDK's; the API's no-op has none
        if callable(flush):
            flush(FLUSH_MS)

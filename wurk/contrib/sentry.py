"""Sentry: report the failures of jobs, with the job's class, queue, jid and retry count.

Built on wurk's own hooks rather than a patched worker, with the shape of
sentry-sdk's RQ and Celery integrations: a tag per job (``wurk_jid``,
``wurk_queue``, ``wurk_job_class``), the job in ``extra["wurk-job"]``, the
class as the transaction name (source ``task``), an unhandled exception of
mechanism ``wurk``, and the arguments sent only when asked.

Duties:
1. :class:`SentryMiddleware` (server middleware): run each job inside its own
   isolation scope, its breadcrumbs cleared and the job described on it, so
   whatever the job logs or captures carries the job; on a failure, keep a
   copy of that scope on the exception for the reporter.
2. :class:`ErrorReporter` (error handler, ``report="every"``): one event for
   every failure, each retry included. :class:`DeathReporter` (death
   handler, ``report="final"``): one event when the job dies or is dropped
   (out of retries, ``retry=False``, an unusable retry count), none for the
   failures it retries; a kill from the API is a person's act, not reported.
   Both report from the job's scope when the middleware kept one (the
   breadcrumbs of the run), else from a scope built from the payload (a class
   no module registered fails before the middleware runs).
3. Arguments: ``send_args=None`` follows the SDK's rule for the arguments
   of its RQ and Celery integrations (``data_collection={"queues": ...}``,
   else ``send_default_pii``: off unless the application turned it on), ``True`` and
   ``False`` decide, and a function ``scrub(args)`` sends what it returns
   (its failure sends nothing of them).
4. :func:`instrument`: add the middleware and the chosen reporter, once;
   without a Config, to the default one and each later default.
5. Import sentry_sdk only here; without it, an ImportError naming the
   ``wurk[sentry]`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any, Literal

try:
    import sentry_sdk
    from sentry_sdk.scope import Scope, should_send_default_pii, use_isolation_scope
    from sentry_sdk.tracing import TransactionSource
    from sentry_sdk.utils import event_from_exception
except ImportError as missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "wurk.contrib.sentry needs the Sentry SDK: pip install 'wurk[sentry]'") from missing

from wurk.api.errors import JobKilledError
from wurk.contrib._follow import each_default
from wurk.settings.config import Config

Report = Literal["every", "final"]
REPORTS: tuple[str, ...] = ("every", "final")
SendArgs = bool | Callable[[list[Any]], Any] | None
MECHANISM = "wurk"
# What the SDK's own integrations send in place of data they hold back.
SENSITIVE_DATA_SUBSTITUTE = "[Filtered]"
# The attribute a failed run's scope rides on from the middleware to the handler.
_SCOPE_ATTR = "__wurk_sentry_scope__"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def job_class(payload: Mapping[str, Any]) -> str:
    """The class to report: an ActiveJob wrapper's ``wrapped`` when present."""
    return _text(payload.get("wrapped")) or str(payload.get("class"))


def job_args(payload: Mapping[str, Any], send_args: SendArgs) -> Any:
    """The arguments as they may be sent: themselves, scrubbed, or the SDK's placeholder."""
    args = payload.get("args")
    if callable(send_args):
        try:
            return send_args(list(args) if isinstance(args, list) else [])
        except Exception:  # noqa: BLE001 - a scrubber that fails sends nothing of them
            return SENSITIVE_DATA_SUBSTITUTE
    allowed = _sdk_sends_queue_data() if send_args is None else send_args
    return args if allowed else SENSITIVE_DATA_SUBSTITUTE


def _sdk_sends_queue_data() -> bool:
    """The SDK's own rule for its queue integrations' arguments: ``data_collection``'s
    ``queues`` when the application set ``data_collection``, else ``send_default_pii``."""
    collection = sentry_sdk.get_client().options.get("data_collection")
    if isinstance(collection, dict) and collection.get("provided_by_user"):
        return bool(collection.get("queues"))
    return should_send_default_pii()


def describe(scope: Scope, payload: Mapping[str, Any], queue: str | None,
             send_args: SendArgs) -> None:
    """Put one job on ``scope``: tags, the ``wurk-job`` extra and the transaction name."""
    name = job_class(payload)
    queue = queue or _text(payload.get("queue")) or "default"
    jid = _text(payload.get("jid"))
    scope.set_tag("wurk_job_class", name)
    scope.set_tag("wurk_queue", queue)
    if jid is not None:
        scope.set_tag("wurk_jid", jid)
    scope.set_transaction_name(name, source=TransactionSource.TASK)
    job: dict[str, Any] = {"class": name, "queue": queue, "jid": jid,
                           "retry_count": payload.get("retry_count"),
                           "args": job_args(payload, send_args)}
    for field in ("wrapped", "created_at", "enqueued_at", "bid"):
        if field in payload:
            job[field] = payload[field]
    scope.set_extra("wurk-job", job)


def capture(exc: BaseException) -> None:
    """One unhandled-exception event, in the current scopes."""
    client = sentry_sdk.get_client()
    if not client.is_active():
        return
    event, hint = event_from_exception(exc, client_options=client.options,
                                       mechanism={"type": MECHANISM, "handled": False})
    sentry_sdk.capture_event(event, hint=hint)


def _report(exc: BaseException, payload: Mapping[str, Any], queue: str | None,
            send_args: SendArgs) -> None:
    kept = getattr(exc, _SCOPE_ATTR, None)
    if isinstance(kept, Scope):
        with use_isolation_scope(kept):
            capture(exc)
        return
    with sentry_sdk.isolation_scope() as scope:
        describe(scope, payload, queue, send_args)
        capture(exc)


def _keep(exc: BaseException, scope: Scope) -> None:
    # An exception that takes no attributes is reported from its payload instead.
    with suppress(AttributeError, TypeError):
        setattr(exc, _SCOPE_ATTR, scope.fork())


class SentryMiddleware:
    """Server middleware: each job in its own isolation scope, described on it."""

    def __init__(self, send_args: SendArgs = None) -> None:
        self.send_args = send_args

    def __call__(self, payload: Mapping[str, Any], queue: str,
                 call_next: Callable[[], Any]) -> Any:
        with sentry_sdk.isolation_scope() as scope:
            scope.clear_breadcrumbs()
            describe(scope, payload, queue, self.send_args)
            try:
                return call_next()
            except BaseException as exc:
                _keep(exc, scope)
                raise


class ErrorReporter:
    """Error handler: one event for every failure of a job."""

    def __init__(self, send_args: SendArgs = None) -> None:
        self.send_args = send_args

    def __call__(self, exc: BaseException, context: Mapping[str, Any]) -> None:
        payload = context.get("job")
        _report(exc, payload if isinstance(payload, Mapping) else {},
                _text(context.get("queue")), self.send_args)


class DeathReporter:
    """Death handler: one event when a job dies or is dropped, none for its retries."""

    def __init__(self, send_args: SendArgs = None) -> None:
        self.send_args = send_args

    def __call__(self, payload: Mapping[str, Any], exc: BaseException) -> None:
        if isinstance(exc, JobKilledError):
            return
        _report(exc, payload, None, self.send_args)


# How long a flush at exit may wait for the transport.
FLUSH_SECONDS = 2.0


def instrument(config: Config | None = None, *, report: Report = "every",
               send_args: SendArgs = None) -> Config:
    """Report the failures of ``config``'s jobs to Sentry; returns it. Again does nothing.

    Without a config: the process's default one, and each one that later
    becomes the default (a swarm child's slot). ``sentry_sdk.init`` is the
    application's to call, before or after this.
    """
    if report not in REPORTS:
        raise ValueError(f"report must be one of {', '.join(REPORTS)}, not {report!r}")
    if not (send_args is None or isinstance(send_args, bool) or callable(send_args)):
        raise TypeError(f"send_args must be None, a bool or a function, "
                        f"not {type(send_args).__name__}")
    if config is None:
        return each_default(lambda default: instrument(default, report=report,
                                                       send_args=send_args))
    if not any(isinstance(mw, SentryMiddleware) for mw in config.server_middleware):
        config.server_middleware.insert(0, SentryMiddleware(send_args))
    reporters = (*config.error_handlers, *config.death_handlers)
    if not any(isinstance(h, ErrorReporter | DeathReporter) for h in reporters):
        if report == "every":
            config.error_handlers.append(ErrorReporter(send_args))
        else:
            config.death_handlers.append(DeathReporter(send_args))
    if flush_events not in config.on_shutdown:
        config.on_shutdown.append(flush_events)
    return config


def flush_events() -> None:
    """An ``on_shutdown`` hook: send the events the SDK still queues (a swarm
    child leaves by ``os._exit``, which skips the SDK's own flush at exit)."""
    sentry_sdk.flush(timeout=FLUSH_SECONDS)

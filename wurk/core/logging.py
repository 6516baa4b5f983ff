"""Logging: wurk is a library first, and a process's entry point decides.

Events have stable dotted names (``job.done``, ``redis.error``) and key/value
context; tests assert on them with ``structlog.testing.capture_logs``.

Where an event goes, decided at each call:
1. A wurk entry point (``wurk run``, ``wurk-swarm``, its children, the admin
   CLI) called :func:`setup`: JSON lines on stderr when it is not a
   terminal, readable lines otherwise, through
   :data:`wurk.core.logsink.SINK`: info and debug lines are written in
   batches (within 0.1 s), louder ones at once; lines stay whole and in
   order, and :func:`flush` (also run at exit) writes what is pending. The
   events of a job's life go a fast way to the same bytes: one function
   in place of structlog's chain (:func:`_emit`), while the chain
   :func:`setup` installed is still structlog's configuration.
2. Otherwise, if the process configured structlog itself, its pipeline.
3. Otherwise (a web app or script that only enqueues, or hosts an embedded
   worker): the standard ``logging`` module, under the event's ``wurk.*``
   logger name, as one "event key=value ..." message. wurk adds only a
   ``NullHandler`` to the ``wurk`` logger, so it prints nothing, on stdout or
   stderr, unless the application's logging configuration says so.

Every string value that holds a URL goes through
:func:`wurk.core.redaction.redact_text` before it is rendered or handed to
``logging``, exception text included: a log line never carries a URL's
password.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import MutableMapping
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import structlog

from wurk.core.logsink import SINK
from wurk.core.redaction import redact_text


class StderrLineLogger:
    """A structlog logger that hands each rendered event, as one line, to the sink."""

    def msg(self, message: str) -> None:
        SINK.write((message + "\n").encode("utf-8", "replace"), urgent=True)

    def quiet(self, message: str) -> None:
        SINK.write((message + "\n").encode("utf-8", "replace"))

    log = warn = warning = error = critical = exception = fatal = msg
    debug = info = quiet


def flush() -> None:
    """Write every log line still pending (an entry point leaving by ``os._exit``)."""
    SINK.flush()


def _json_fallback(obj: Any) -> Any:
    """A value JSON cannot hold: its ``__structlog__()``, else its repr (as structlog)."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


class JsonRenderer:
    """structlog's JSONRenderer output (``json.dumps(event, default=...)``), from
    an encoder built once: json.dumps with ``default=`` builds a new encoder,
    and JSONEncoder.encode a new C encoder, on every call."""

    def __init__(self) -> None:
        encoder = json.JSONEncoder(default=_json_fallback)
        self._encode: Any = encoder.encode
        if c_make_encoder is not None:
            # No circular-reference markers: a dict shared between threads
            # would be corrupted; a cyclic value fails with RecursionError.
            fast = c_make_encoder(None, _json_fallback, encode_basestring_ascii, None,
                                  ": ", ", ", False, False, True)
            self._encode = lambda event: "".join(fast(event, 0))

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
        return str(self._encode(event))


_stamp_second: tuple[int, str] = (-1, "")


def add_timestamp(_logger: Any, _method: str,
                  event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``timestamp``: ISO 8601 in UTC with microseconds, as
    ``2026-01-02T03:04:05.123456Z``."""
    event["timestamp"] = timestamp()
    return event


def timestamp() -> str:
    """Now as :func:`add_timestamp` writes it; the seconds part formatted once a second."""
    global _stamp_second  # noqa: PLW0603 - one (second, text) pair, replaced whole
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    cached, prefix = _stamp_second
    if second != cached:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _stamp_second = (second, prefix)
    return f"{prefix}.{nanos // 1000:06d}Z"


def redact_urls(_logger: Any, _method: str,
                event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: mask the password of any URL in a string value."""
    for key, value in event.items():
        if isinstance(value, str) and "://" in value:
            event[key] = redact_text(value)
    return event


def _factory(*_args: Any) -> StderrLineLogger:
    return StderrLineLogger()


# The level setup() installed; NOTSET until a wurk entry point calls it.
_threshold = logging.NOTSET
_entry_point = False
# Fields every line of an entry point's process carries (pid; a swarm
# child's slot and index), set again after each fork.
_process_fields: dict[str, Any] = {}
_thread_tags = threading.local()
# Read once: getLevelNamesMapping() copies its dict, and enabled() runs per job.
_LEVELS = logging.getLevelNamesMapping()
# The processor list and renderer setup() installed, for the fast path.
_chain: list[Any] | None = None
_renderer: Any = None
_METHOD_LEVELS = {name: _LEVELS[name.upper()]
                  for name in ("debug", "info", "warning", "error", "critical")}
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"

logging.getLogger("wurk").addHandler(logging.NullHandler())


def enabled(level: str) -> bool:
    """Whether events at ``level`` would be written: a cheap check for hot paths."""
    number = _LEVELS[level.upper()]
    if _entry_point or structlog.is_configured():
        return number >= _threshold
    return logging.getLogger("wurk").isEnabledFor(number)


def tid() -> str:
    """This thread's short id, as Sidekiq's ``tid``: base 36 of the native thread id
    (the same string names the thread's field in the work hash)."""
    tag: str | None = getattr(_thread_tags, "tag", None)
    if tag is None:
        tag = _thread_tags.tag = base36(threading.get_native_id())
    return tag


def base36(number: int) -> str:
    out = ""
    while True:
        number, rem = divmod(number, 36)
        out = _BASE36[rem] + out
        if number == 0:
            return out


def bind_process(**fields: Any) -> None:
    """Fields for every line this process writes from now on (entry points only)."""
    _process_fields.update(fields)


def _add_process_fields(_logger: Any, _method: str,
                        event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in _process_fields.items():
        event.setdefault(key, value)
    return event


def setup(level: str = "info", fmt: str = "auto") -> None:
    """Configure this process's output (entry points only). Safe to call again after fork."""
    global _threshold, _entry_point, _chain, _renderer  # noqa: PLW0603 - one per process
    _threshold = _LEVELS[level.upper()]
    _entry_point = True
    _process_fields.clear()
    _process_fields["pid"] = os.getpid()
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    _renderer = (JsonRenderer() if use_json
                 else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    # _emit does the same steps, in the same order, for the events without a traceback.
    _chain = [
        structlog.contextvars.merge_contextvars,
        _add_process_fields,
        structlog.processors.add_log_level,
        add_timestamp,
        structlog.processors.format_exc_info,
        redact_urls,
        _renderer,
    ]
    structlog.configure(
        processors=_chain,
        wrapper_class=structlog.make_filtering_bound_logger(_threshold),
        logger_factory=_factory,
        # Never cache: a logger bound before fork must pick up the child's setup.
        cache_logger_on_first_use=False,
    )


def _as_message(_logger: Any, _method: str,
                event: MutableMapping[str, Any]) -> tuple[tuple[str], dict[str, Any]]:
    """The last step for the standard logging module: one readable line, and
    the exception handed over as ``exc_info`` for the application's formatter."""
    name = event.pop("event", "")
    exc_info = event.pop("exc_info", None)
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return ((f"{name} {fields}" if fields else str(name),), {"exc_info": exc_info})


def _fast(fields: dict[str, Any]) -> bool:
    """Whether setup()'s chain is still structlog's (capture_logs and an
    application's own configure() replace it) and the event needs no traceback."""
    chain = _chain
    return (chain is not None and "exc_info" not in fields and chain[-1] is _renderer
            and structlog.get_config()["processors"] is chain)


def json_renderer() -> JsonRenderer | None:
    """The JSON renderer of setup()'s chain while that chain is still in use
    (see :func:`_fast`), else None: for :mod:`wurk.core.joblog`'s shortcut."""
    renderer = _renderer
    if not isinstance(renderer, JsonRenderer) or not _fast({}):
        return None
    return renderer


def process_fields() -> dict[str, Any]:
    """The fields every line of this process carries (read-only)."""
    return _process_fields


def _emit(method: str, event: str, fields: dict[str, Any]) -> None:
    """setup()'s chain as one function: the same line, without structlog's
    per-call logger binding, context copy and processor loop."""
    level = _METHOD_LEVELS[method]
    if level < _threshold:
        return
    fields["event"] = event
    structlog.contextvars.merge_contextvars(None, method, fields)
    for key, value in _process_fields.items():
        fields.setdefault(key, value)
    fields["level"] = method
    add_timestamp(None, method, fields)
    line = _renderer(None, method, fields)
    if "://" in line:  # a string value may hold a URL: redact, render again
        line = _renderer(None, method, redact_urls(None, method, fields))
    line += "\n"
    SINK.write(line.encode("utf-8", "replace"), urgent=level >= logging.WARNING)


class Logger:
    """A logger named ``wurk.*`` that sends each event where the process wants it."""

    __slots__ = ("_stdlib", "_structlog", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._structlog: Any = structlog.get_logger(name)
        self._stdlib: Any = structlog.wrap_logger(
            logging.getLogger(name), wrapper_class=structlog.stdlib.BoundLogger,
            processors=[structlog.stdlib.filter_by_level, structlog.contextvars.merge_contextvars,
                        redact_urls, _as_message],
            cache_logger_on_first_use=False)

    def _target(self) -> Any:
        return self._structlog if _entry_point or structlog.is_configured() else self._stdlib

    def debug(self, event: str, **fields: Any) -> None:
        if _fast(fields):
            _emit("debug", event, fields)
        else:
            self._target().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        if _fast(fields):
            _emit("info", event, fields)
        else:
            self._target().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        if _fast(fields):
            _emit("warning", event, fields)
        else:
            self._target().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        if _fast(fields):
            _emit("error", event, fields)
        else:
            self._target().error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._target().exception(event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        if _fast(fields):
            _emit("critical", event, fields)
        else:
            self._target().critical(event, **fields)


def get_logger(name: str) -> Logger:
    return Logger(name)

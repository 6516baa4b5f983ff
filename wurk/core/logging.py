"""Logging: wurk is a library first, and a process's entry point decides.

Events have stable dotted names (``job.done``, ``redis.error``) and key/value
context; tests assert on them with ``structlog.testing.capture_logs``.

Where an event goes, decided at each call:
1. A wurk entry point (``wurk run``, ``wurk-swarm``, its children, the admin
   CLI) called :func:`setup`: JSON lines on stderr when it is not a
   terminal, readable lines otherwise. Each line is one ``os.write`` with no
   lock: a lock held by a logging thread at the moment another thread forks
   would stay held forever in the child, and one write of a line up to
   PIPE_BUF bytes is not interleaved with other lines on a pipe.
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

import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

import structlog

from wurk.core.redaction import redact_text


class StderrLineLogger:
    """A structlog logger that writes each rendered event as one line to fd 2."""

    def msg(self, message: str) -> None:
        data = (message + "\n").encode("utf-8", "replace")
        try:
            while data:
                written = os.write(2, data)
                data = data[written:]
        except OSError:
            pass  # stderr closed: logging must never take the process down

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


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
    global _threshold, _entry_point  # noqa: PLW0603 - one logging level per process
    _threshold = _LEVELS[level.upper()]
    _entry_point = True
    _process_fields.clear()
    _process_fields["pid"] = os.getpid()
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_process_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_urls,
            renderer,
        ],
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
        self._target().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._target().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._target().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._target().error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._target().exception(event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._target().critical(event, **fields)


def get_logger(name: str) -> Logger:
    return Logger(name)

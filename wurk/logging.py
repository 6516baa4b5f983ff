"""structlog setup: JSON lines when stderr is not a terminal, readable otherwise.

Events have stable dotted names (``job.done``, ``redis.error``) and key/value
context; tests assert on them with ``structlog.testing.capture_logs``.

Lines go to stderr with one ``os.write`` each and no lock: a lock held by a
logging thread at the moment another thread forks would stay held forever
in the child. A single write of a line is not interleaved with other lines
on a pipe for lines up to PIPE_BUF bytes.

Every string value that holds a URL goes through
:func:`wurk.redaction.redact_text` before it is rendered, exception text
included: a log line never carries a URL's password.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from wurk.redaction import redact_text


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


# The level setup() installed; before any setup() everything is passed on to
# structlog (whatever it is configured to do, e.g. capture_logs in tests).
_threshold = logging.NOTSET


def enabled(level: str) -> bool:
    """Whether events at ``level`` would be written: a cheap check for hot paths."""
    return logging.getLevelNamesMapping()[level.upper()] >= _threshold


def setup(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for this process. Safe to call again after fork."""
    global _threshold  # noqa: PLW0603 - one logging level per process
    _threshold = logging.getLevelNamesMapping()[level.upper()]
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_urls,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_factory,
        # Never cache: a logger bound before fork must pick up the child's setup.
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)

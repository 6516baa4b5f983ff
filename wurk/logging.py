"""structlog setup: JSON lines when stderr is not a terminal, readable otherwise.

Events have stable dotted names (``job.done``, ``redis.error``) and key/value
context; tests assert on them with ``structlog.testing.capture_logs``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def setup(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for this process. Safe to call again after fork."""
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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        # Never cache: a logger bound before fork must pick up the child's setup.
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)

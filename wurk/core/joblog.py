"""The two lines of a job's life, ``job.start`` and ``job.done``, made cheap.

At info level every job writes both, so their cost is paid once per job and
twice per line: on a no-op job it was a third of the throughput. The lines
carry the same fields each time (jid, class, queue, tid), so
:func:`job_lines` renders them once per job, into the head of a JSON object,
and each line only adds its event name, the process's fields (rendered once
per change), the level and a timestamp. The bytes are the ones
:func:`wurk.core.logging.setup`'s chain writes for the same call, key order
included.

Whenever that shortcut would not write those bytes (not a wurk entry point,
readable console output rather than JSON, a chain an application or a test
replaced, values bound with structlog's contextvars, a value holding a URL
to redact), the lines go through the ordinary logger instead.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as _escape
from typing import Any

import structlog

from wurk.core import logging as wlog
from wurk.core.logsink import SINK


class _SlowLines:
    """The ordinary logger's way: every line through :class:`wurk.core.logging.Logger`."""

    __slots__ = ("_context", "_log")

    def __init__(self, log: wlog.Logger, context: dict[str, Any]) -> None:
        self._log = log
        self._context = context

    def start(self) -> None:
        self._log.info("job.start", **self._context)

    def done(self, elapsed: float) -> None:
        self._log.info("job.done", **self._context, elapsed=elapsed)


class _FastLines:
    __slots__ = ("_head", "_slow", "_tail")

    def __init__(self, head: str, tail: str, slow: _SlowLines) -> None:
        self._head = head  # '{"jid": ..., "tid": "..."': the object's start, the job's fields
        self._tail = tail  # the process's fields, the level, and the timestamp's key
        self._slow = slow  # for a done line after the job bound values of its own

    def start(self) -> None:
        SINK.write(f'{self._head}, "event": "job.start"{self._tail}{wlog.timestamp()}"}}\n'
                   .encode("utf-8", "replace"))

    def done(self, elapsed: float) -> None:
        if structlog.contextvars.get_contextvars():
            # The job or a middleware bound values (a request id): the chain adds them.
            self._slow.done(elapsed)
            return
        SINK.write(f'{self._head}, "elapsed": {float(elapsed)!r}, "event": "job.done"'
                   f'{self._tail}{wlog.timestamp()}"}}\n'.encode("utf-8", "replace"))


JobLines = _SlowLines | _FastLines

# The process's fields as the tail of a JSON object (', "pid": 12, ...'),
# rendered again whenever they change (a fork, a swarm child's slot).
_process_cache: tuple[dict[str, Any], str] = ({}, "")
_FIELDS = frozenset(("jid", "class", "queue", "tid"))
_RESERVED = _FIELDS | {"elapsed", "event", "level", "timestamp"}


def job_lines(log: wlog.Logger, context: dict[str, Any]) -> JobLines | None:
    """How this job's start and done lines are written; None when info is off.

    ``context`` holds the job's ``jid``, ``class``, ``queue`` and ``tid``.
    """
    if not wlog.enabled("info"):
        return None
    renderer = wlog.json_renderer()
    slow = _SlowLines(log, context)
    if (renderer is None or context.keys() != _FIELDS
            or structlog.contextvars.get_contextvars()):
        return slow
    head = _head(renderer, context)
    if "://" in head:  # a class or queue name that holds a URL: the chain redacts it
        return slow
    return _FastLines(head[:-1], f'{_process_part(renderer)}, "level": "info", "timestamp": "',
                      slow)


def _head(renderer: wlog.JsonRenderer, context: dict[str, Any]) -> str:
    """The job's fields as the renderer writes them (``{"jid": "...", ...}``):
    four strings escaped directly, which is what nearly every job has."""
    jid, cls, queue, tid = context["jid"], context["class"], context["queue"], context["tid"]
    if type(jid) is str and type(cls) is str and type(queue) is str and type(tid) is str:
        return (f'{{"jid": {_escape(jid)}, "class": {_escape(cls)}, '
                f'"queue": {_escape(queue)}, "tid": {_escape(tid)}}}')
    return renderer(None, "info", {"jid": jid, "class": cls, "queue": queue, "tid": tid})


def _process_part(renderer: wlog.JsonRenderer) -> str:
    global _process_cache  # noqa: PLW0603 - one (fields, text) pair, replaced whole
    fields = wlog.process_fields()
    cached, text = _process_cache
    if fields != cached:
        # As the chain's setdefault: a field an event carries is not overwritten.
        own = {k: v for k, v in fields.items() if k not in _RESERVED}
        text = ", " + renderer(None, "info", wlog.redact_urls(None, "info", own))[1:-1] \
            if own else ""
        _process_cache = (dict(fields), text)
    return text

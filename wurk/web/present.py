"""How the dashboard shows things: numbers, times, jobs, and JSON for scripts.

Duties:
1. Jinja2 filters: ``num`` (thousands separators), ``ago`` / ``duration``
   (relative times; the absolute UTC time goes in a title attribute),
   ``utc`` (ISO time), ``short`` (a long text cut for a table cell).
2. :func:`args_text`: a job's arguments as Sidekiq Web shows them
   (ActiveJob's inner arguments, encrypted ones hidden), as compact JSON,
   and a keyword push's keywords as ``name=value``.
3. :func:`fields`: every payload field of a job, each as readable text.
4. :func:`json_for_script`: JSON safe inside an HTML ``<script
   type="application/json">`` block (``<``, ``>``, ``&`` and the line
   separators escaped), so no payload can close the block.
5. :func:`environment`: the Jinja2 environment, autoescaping every template.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from wurk.api.records import JobRecord
from wurk.wire import keywords

SHORT = 140
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                   "\u2028": "\\u2028", "\u2029": "\\u2029"}
_UNITS = ((86400 * 365, "year"), (86400 * 30, "month"), (86400, "day"), (3600, "hour"),
          (60, "minute"), (1, "second"))


def num(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def duration(seconds: float | None) -> str:
    """``3 minutes``, ``1 day``: the largest whole unit."""
    if seconds is None or not math.isfinite(seconds):
        return ""  # a garbage time read from Redis ("inf", "nan") shows as nothing
    seconds = abs(seconds)
    for size, unit in _UNITS:
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return "0 seconds"


def ago(at: float | None, now: float | None = None) -> str:
    """``3 minutes ago`` or ``in 2 hours``; "" for no time."""
    if at is None or not math.isfinite(at):
        return ""
    delta = (now if now is not None else time.time()) - at
    if abs(delta) < 1:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(delta)}"


def utc(at: float | None) -> str:
    if at is None:
        return ""
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(at)


def iso(at: float | None) -> str:
    if at is None:
        return ""
    try:
        return datetime.fromtimestamp(at, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return ""


def short(value: Any, limit: int = SHORT) -> str:
    shown = value if isinstance(value, str) else str(value)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def args_text(record: JobRecord) -> str:
    """The arguments, as Sidekiq Web shows them, comma-separated JSON values;
    a keyword push's keywords as ``name=value`` (:mod:`wurk.wire.keywords`)."""
    args = record.display_args
    if keywords.marked(record.item) and args and isinstance(args[-1], dict):
        named = args[-1]
        # Another client's key that is no Python name ("a=1, b", "") is shown
        # as Python passes it, in **{...}, so it cannot pass for other keywords.
        odd = {name: value for name, value in named.items() if not name.isidentifier()}
        return ", ".join([*(to_json(arg) for arg in args[:-1]),
                          *(f"{name}={to_json(value)}" for name, value in named.items()
                            if name not in odd),
                          *([f"**{to_json(odd)}"] if odd else [])])
    return ", ".join(to_json(arg) for arg in args)


# Arguments longer than this are shown once, under Arguments, not again in
# the table of every field (a 1 MB argument made a 2.1 MB page).
ARGS_SHOWN_ONCE = 4096


def fields(record: JobRecord) -> list[tuple[str, str]]:
    """Every payload field, sorted by name, values as (pretty) JSON text."""
    if not record.valid:
        return [("(raw)", record.value.decode("utf-8", "replace")
                 if isinstance(record.value, bytes) else record.value)]
    shown = [(str(name), value if isinstance(value, str)
              else json.dumps(value, ensure_ascii=False, indent=2, default=str))
             for name, value in sorted(record.item.items())]
    return [(name, f"({len(text):,} characters: shown under Arguments above)"
             if name == "args" and len(text) > ARGS_SHOWN_ONCE else text)
            for name, text in shown]


def json_for_script(value: Any) -> Markup:
    """JSON that can sit inside ``<script type="application/json">`` untouched.

    Marked safe for Jinja2 only after every character that could end the
    block or start markup is a JSON escape.
    """
    encoded = json.dumps(value, separators=(",", ":"), default=str)
    return Markup("".join(_SCRIPT_ESCAPES.get(c, c) for c in encoded))  # noqa: S704


def raw_text(record: JobRecord) -> str:
    value = record.value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def segment(value: Any) -> str:
    """One URL path segment: unlike Jinja's ``urlencode``, a ``/`` in it is encoded too."""
    return quote(str(value), safe="")


def environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(num=num, ago=ago, utc=utc, iso=iso, short=short, duration=duration,
                       args_text=args_text, raw_text=raw_text, to_json=to_json, segment=segment)
    env.globals.update(fields=fields, json_for_script=json_for_script)
    return env

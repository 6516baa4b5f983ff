"""Keyword arguments in a Sidekiq payload: a trailing JSON object and a marker.

Sidekiq's ``args`` is a list; it has no place for keywords. wurk writes a
keyword push ``f(1, user_id=42)`` as ``"args": [1, {"user_id": 42}]`` with
the payload field ``"kwargs": true`` saying that the last element is the
keywords. A positional push carries no marker and keeps its exact bytes. A
Ruby worker sees an ordinary trailing hash (string keys), which is what a
Ruby ``perform(a, options)`` takes; the dashboard shows ``user_id=42``.

Duties:
1. ``encode``: the args list and marker for a push with keywords.
2. ``split``: a payload's positional arguments and keywords, for the worker.
3. ``problem``: what is wrong with a payload whose marker has no object to
   mark, so a client refuses to write one. A worker that reads one (another
   client wrote it) calls the job with every argument by position, as
   ``split`` says: such a job is not malformed for the queue's other
   readers, and an unknown class must keep its unknown-class path.
4. ``call_args``: the arguments as the call gave them, for a unique lock's
   digest: a bulk push that marks its jobs gives ``{}`` to one that passed
   no keywords, and that call must lock the key it locks pushed alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MARKER = "kwargs"
_NONE: dict[str, Any] = {}


def encode(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """``args`` followed by the keywords as one object (the caller sets ``MARKER``)."""
    return [*args, dict(kwargs)]


def marked(payload: Mapping[str, Any]) -> bool:
    return payload.get(MARKER) is True


def split(payload: Mapping[str, Any]) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """The positional arguments and keywords a worker calls the job with."""
    args = payload["args"]
    if payload.get(MARKER) is True and args and isinstance(args[-1], dict):
        return args[:-1], args[-1]
    return args, _NONE


def problem(payload: Mapping[str, Any]) -> str | None:
    """Why a marked payload cannot be called (None: it can, or it is not marked)."""
    if payload.get(MARKER) is not True:
        return None
    args = payload.get("args")
    if not isinstance(args, list) or not args or not isinstance(args[-1], dict):
        return f"'{MARKER}' is true but the last of 'args' is not an object of keywords"
    return None


def call_args(payload: Mapping[str, Any]) -> Any:
    """``args``, less the empty object of keywords a marked bulk push gave a job
    that passed none (anything else: ``args`` as it is)."""
    args = payload.get("args")
    if (payload.get(MARKER) is True and isinstance(args, list) and args
            and isinstance(args[-1], dict) and not args[-1]):
        return args[:-1]
    return args

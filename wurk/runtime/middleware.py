"""Server middleware: code that wraps every job execution.

A middleware is a callable ``mw(payload, queue, call_next)`` that must call
``call_next()`` to run the rest of the chain and the job, or return without
calling it to skip the job (it then counts as done). Raising fails the job
as the job raising would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wurk.settings.hooks import ServerMiddleware


def invoke(chain: Sequence[ServerMiddleware], payload: Mapping[str, Any], queue: str,
           job: Callable[[], Any]) -> Any:
    """Run ``job`` inside every middleware of ``chain``, first one outermost."""
    if not chain:
        return job()

    def step(index: int) -> Any:
        if index == len(chain):
            return job()
        return chain[index](payload, queue, lambda: step(index + 1))

    return step(0)

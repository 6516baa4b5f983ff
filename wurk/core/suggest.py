""""Did you mean ...?": the close match to a mistyped name among the known ones.

One helper for every place that refuses an unknown name, so each says it
the same way: a topology's top-level, ``[wurk]``, ``[[slot]]`` and
``[[periodic]]`` keys, the ``[wurk]`` table of ``wurk run -C``, and the
command line's subcommands and choices.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: object, known: Iterable[str]) -> str | None:
    """The known name close enough to ``name`` to be what was meant, if any."""
    if not isinstance(name, str):
        return None
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return close[0] if close else None


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the known name closest to ``name``, else ''."""
    match = closest(name, known)
    return f" (did you mean {match!r}?)" if match else ""

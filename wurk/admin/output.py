"""How admin commands print: aligned plain-text tables for people, JSON for scripts.

Duties:
1. ``table``: left-aligned columns separated by two spaces, a header row,
   no borders, colours or extra dependencies; an empty table prints a
   one-line "no ..." message instead.
2. ``fields``: a two-column "name  value" block for one record (``wurk stats``).
3. Times for people: ``when`` (``12s ago``, ``in 4m 10s``), ``duration``
   and ``megabytes``; ``clip`` shortens long cells.
4. ``to_json``: the stable ``--json`` document, indented, keys in the order
   the command built them.
5. ``printable``: text from Redis shown with its control characters escaped,
   so a crafted job argument or profile name cannot drive the terminal
   (``table`` and ``fields`` apply it to every cell).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from wurk.push.time_options import MAX_EPOCH

GAP = "  "
CLIP = 60
_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with C0/C1 control characters (ESC, CR, NUL...) as ``\\xNN`` escapes."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str) -> list[str]:
    """The lines of an aligned table (the last column is never padded)."""
    if not rows:
        return [empty]
    cells = [[str(h) for h in headers], *[[printable(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            .rstrip() for row in cells]


def fields(pairs: Sequence[tuple[str, Any]]) -> list[str]:
    width = max((len(name) for name, _ in pairs), default=0)
    return [f"{name.ljust(width)}{GAP}{printable(str(value))}" for name, value in pairs]


def duration(seconds: float) -> str:
    """``0s``, ``42s``, ``3m 12s``, ``2h 5m``, ``3d 4h``: the two largest units."""
    if not math.isfinite(seconds):
        return repr(seconds)
    whole = int(abs(seconds))
    parts: list[str] = []
    for unit, size in _UNITS:
        if whole >= size or (unit == "s" and not parts):
            parts.append(f"{whole // size}{unit}")
            whole %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def when(at: float | None, now: float) -> str:
    """A moment relative to ``now``: ``12s ago``, ``in 4m 10s``; ``-`` when unknown.

    A value no clock reaches (another client's ``inf`` score, a year past
    5138) is shown as the number it is, never turned into a duration.
    """
    if at is not None and (not math.isfinite(at) or abs(at) >= MAX_EPOCH):
        return f"{at!r} (not a time)"
    if at is None or at <= 0:
        return "-"
    delta = at - now
    return f"in {duration(delta)}" if delta >= 1 else f"{duration(delta)} ago"


def megabytes(kb: int) -> str:
    return f"{kb / 1024:.0f} MB"


def clip(value: Any, width: int = CLIP) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, default=str)
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def to_json(payload: Any) -> str:
    """Strict JSON: a non-finite number read from Redis (a score of ``inf``) is null."""
    return json.dumps(_finite(payload), indent=2, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value

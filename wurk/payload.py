"""Job payloads: JSON in and out, jids, timestamps and argument checks.

Payloads are plain dicts that keep every key they arrived with, so fields
wurk does not know (Sidekiq Pro's ``bid``, ``tags``, ``unique_for``…) survive
every move between Redis structures.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any


class ArgumentError(TypeError):
    """A job argument is not JSON-native; the message names it."""


class PayloadError(ValueError):
    """A payload read from Redis is not a job object."""


def new_jid() -> str:
    """24 lowercase hex characters, as Sidekiq's ``SecureRandom.hex(12)``."""
    return secrets.token_hex(12)


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads_job(raw: str | bytes) -> dict[str, Any]:
    """Parse a queue entry. Raises PayloadError for anything that is not a job."""
    try:
        job = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    if not isinstance(job, dict):
        raise PayloadError(f"not a JSON object: {type(job).__name__}")
    if not isinstance(job.get("class"), str) or not isinstance(job.get("args"), list):
        raise PayloadError("missing a string 'class' or a list 'args'")
    return job


def check_args(args: Any, where: str = "args") -> None:
    """Refuse anything JSON cannot carry unchanged; name the offending argument."""
    if args is None or isinstance(args, bool | str | int):
        return
    if isinstance(args, float):
        if not math.isfinite(args):
            raise ArgumentError(f"{where} is {args!r}, which JSON cannot carry")
        return
    if isinstance(args, list):
        for i, item in enumerate(args):
            check_args(item, f"{where}[{i}]")
        return
    if isinstance(args, dict):
        for key, value in args.items():
            if not isinstance(key, str):
                raise ArgumentError(f"{where} has a non-string key {key!r}")
            check_args(value, f"{where}[{key!r}]")
        return
    raise ArgumentError(
        f"{where} is a {type(args).__name__} ({args!r:.60}); job arguments must be "
        "JSON-native: str, int, float, bool, None, list or dict with str keys"
    )


def now_stamp(fmt: str, now: float | None = None) -> float | int:
    """A timestamp for a payload field: float seconds, or Sidekiq 8's int ms."""
    t = time.time() if now is None else now
    return int(t * 1000) if fmt == "ms" else t


def to_seconds(value: Any) -> float | None:
    """Read any Sidekiq timestamp: a JSON float is seconds, an integer is ms.

    A bare integer small enough to be seconds (before the year 2100 as
    seconds, i.e. under 4.1e9) is taken as seconds, for hand-written data.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and value > 4_102_444_800:
        return value / 1000.0
    return float(value)


def score(seconds: float) -> str:
    """A sorted-set score for a run-at time, written as Sidekiq does: a float string."""
    return repr(float(seconds))

"""Reasons for dead entries kept as the bytes they were found as.

A payload that is not a job this process can run and write back (not JSON,
not an object, no class, a lone surrogate no UTF-8 writer can carry) goes
to ``dead`` byte for byte, so a person (or Ruby Sidekiq's Web UI) sees
exactly what some client wrote and a ZREM of those bytes deletes it. Its
``error_class``/``error_message`` cannot be stamped into bytes that must
stay unchanged, so they live beside the set:

1. ``wurk:dead:notes``, a hash from the entry's :func:`digest` (SHA-1 of the
   member's bytes) to a JSON note ``{"error_class", "error_message", "at"}``;
   ``wurk:dead:notes-at``, the same digests scored by time of death.
2. :data:`NOTE` writes one note and trims both keys as the dead set is
   trimmed (by age, ``dead_timeout``, and count, ``dead_max_jobs``), so they
   never outgrow it; a note is written before its entry, so an entry never
   lacks the note it should have (a note without an entry ages out).
3. :func:`forget_commands` drop a note with its entry (a delete or a clear
   from wurk's API); an entry Sidekiq deletes leaves its note to age out.
4. :func:`handle`: what a listing shows and a command takes for an entry
   with no usable jid: ``raw-`` and the first 12 hex digits of the digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wurk.wire import keys
from wurk.wire.lua import Script

HANDLE_PREFIX = "raw-"
HANDLE_DIGITS = 12
KEYS = [keys.DEAD_NOTES, keys.DEAD_NOTES_AT]


def as_bytes(raw: bytes | str) -> bytes:
    """A member as Redis holds it (a str member is written as UTF-8)."""
    return raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")


def digest(raw: bytes | str) -> str:
    return hashlib.sha1(as_bytes(raw)).hexdigest()  # noqa: S324 - a name, not a secret


def handle(raw: bytes | str) -> str:
    return HANDLE_PREFIX + digest(raw)[:HANDLE_DIGITS]


def is_handle(text: str) -> bool:
    tail = text[len(HANDLE_PREFIX):]
    return text.startswith(HANDLE_PREFIX) and len(tail) == HANDLE_DIGITS and all(
        c in "0123456789abcdef" for c in tail)


def note_text(error_class: str, error_message: str, at: float) -> str:
    # ASCII escapes: the message may quote the payload's own unwritable text.
    return json.dumps({"error_class": error_class, "error_message": error_message[:2000],
                       "at": at}, ensure_ascii=True)


def parse_note(value: bytes | str | None) -> dict[str, Any]:
    """The note's fields, or {} for none (or one that is not a note)."""
    if value is None:
        return {}
    try:
        note = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return note if isinstance(note, dict) else {}


def note_args(raw: bytes | str, reason: tuple[str, str], now: float, *,
              dead_timeout: float, dead_max_jobs: int) -> list[Any]:
    """NOTE's ARGV for ``reason`` (error_class, error_message) given to ``raw``."""
    return [digest(raw), note_text(*reason, now), repr(float(now)),
            repr(float(now - dead_timeout)), dead_max_jobs]


def forget_commands(raws: list[bytes | str]) -> list[tuple[Any, ...]]:
    digests = [digest(raw) for raw in raws]
    if not digests:
        return []
    return [("HDEL", keys.DEAD_NOTES, *digests), ("ZREM", keys.DEAD_NOTES_AT, *digests)]


# Write one note, then trim notes older than the dead set keeps entries and
# beyond its size (oldest first). Trimming is bounded by what one call adds:
# at most a few stale notes go per call, so no call is long.
# KEYS: notes hash, notes-at set. ARGV: digest, note, now score, age cutoff
# score, max notes.
NOTE = Script(
    "dead_note",
    """
redis.call("hset", KEYS[1], ARGV[1], ARGV[2])
redis.call("zadd", KEYS[2], ARGV[3], ARGV[1])
local old = redis.call("zrangebyscore", KEYS[2], "-inf", ARGV[4], "limit", 0, 100)
local over = redis.call("zcard", KEYS[2]) - tonumber(ARGV[5])
if over > 0 then
  for _, d in ipairs(redis.call("zrange", KEYS[2], 0, math.min(over, 100) - 1)) do
    old[#old + 1] = d
  end
end
for _, d in ipairs(old) do
  redis.call("hdel", KEYS[1], d)
  redis.call("zrem", KEYS[2], d)
end
return #old
""",
)

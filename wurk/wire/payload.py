"""Job payloads: JSON in and out, jids, timestamps and argument checks.

Payloads are plain dicts that keep every key they arrived with, so fields
wurk does not know (Sidekiq Pro's ``bid``, ``tags``, ``unique_for``…) survive
every move between Redis structures. Floats are written as Ruby's JSON
writes them, so a payload Sidekiq re-dumps keeps the same bytes.

Only real JSON is a payload: ``NaN``, ``Infinity`` and numbers that overflow
a float (``1e400``) are refused when read, as is nesting too deep to decode,
so such a job goes to ``dead`` as malformed at once instead of failing later
when wurk writes it back. So is a payload holding a lone surrogate (JSON's
``"\\ud800"``, which Python's ``json.dumps`` writes for a surrogate-escaped
filename): it decodes, but no retry, dead or result entry of it can be
written as UTF-8. A client refuses to push one (:func:`check_text`). So is
one marked ``"kwargs": true`` whose last argument is no object of keywords
(:mod:`wurk.wire.keywords`).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sys
import time
from typing import Any

from wurk.core.validate import is_number


class ArgumentError(TypeError):
    """A job argument is not JSON-native; the message names it."""


class PayloadError(ValueError):
    """A payload read from Redis is not a job object."""


def new_jid() -> str:
    """24 lowercase hex characters, as Sidekiq's ``SecureRandom.hex(12)``."""
    return secrets.token_hex(12)


def new_jids(count: int) -> list[str]:
    """``count`` jids as :func:`new_jid` makes them, from one read of the OS's randomness."""
    text = os.urandom(12 * count).hex()
    return [text[start:start + 24] for start in range(0, 24 * count, 24)]


def dumps(obj: Any) -> str:
    """JSON as Ruby's ``JSON.generate`` writes it, so Sidekiq's re-dump of a
    member it read from a sorted set finds the same bytes (see ruby_floats)."""
    return with_ruby_floats(compact_json(obj))


# ``json.dumps`` with options builds a JSONEncoder, and the encoder a C
# encoder, on every call: most of the cost of serialising a small payload.
# Both are built once here. The shared C encoder keeps no circular-reference
# marks (a dict of ids shared between threads would see another thread's
# objects); a structure it cannot finish is handed to the stock encoder,
# which raises what json.dumps always raised.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode = (None if _make_c_encoder is None else _make_c_encoder(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False,
    False))


def compact_json(obj: Any) -> str:
    """``json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``."""
    if _c_encode is None:
        return _ENCODER.encode(obj)
    try:
        return "".join(_c_encode(obj, 0))
    except RecursionError:
        return _ENCODER.encode(obj)  # circular ("Circular reference detected") or too deep


def with_ruby_floats(text: str) -> str:
    """A compact JSON text with its floats in Ruby's forms (a no-op for most)."""
    return ruby_floats(text) if _may_differ_from_ruby(text) else text


# Where Python's float repr and Ruby's Float#to_s disagree (checked against
# Ruby 3.1 over every exponent, subnormals and random bit patterns): Ruby
# writes an integral mantissa as "1.0e+16" where Python writes "1e+16", and
# writes a whole number from 1e15 in exponent form ("1.0e+15") where Python
# waits until 1e16 (a 16-digit number with a fraction stays fixed in both).
# Every other float prints the same digits both ways. The cheap checks run on
# every payload; the token pass only on the rare one they flag.
_EXPONENT = re.compile(r"[0-9]e[+-]")
_POINT_ZERO = re.compile(r"\.0(?![0-9])")
_SIXTEEN_DIGIT_WHOLE = re.compile(r"[0-9]{16}\.0(?![0-9])")


def _may_differ_from_ruby(text: str) -> bool:
    # Substring and literal-led searches first: they clear a typical payload
    # in well under a microsecond, where one combined pattern costs ten.
    if ("e+" in text or "e-" in text) and _EXPONENT.search(text):
        return True
    return _POINT_ZERO.search(text) is not None and \
        _SIXTEEN_DIGIT_WHOLE.search(text) is not None


# A JSON string (skipped whole, so its text is never touched) or a number.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.+-])-?\d+(?:\.\d+)?(?:e[+-]\d+)?')


def ruby_floats(text: str) -> str:
    """Rewrite the floats of a compact JSON text the way Ruby prints them."""
    return _TOKEN.sub(_ruby_number, text)


def _ruby_number(match: re.Match[str]) -> str:
    token = match.group(0)
    if token.startswith('"'):
        return token
    sign, digits = ("-", token[1:]) if token.startswith("-") else ("", token)
    mantissa, _, exponent = digits.partition("e")
    if exponent:
        return token if "." in mantissa else f"{sign}{mantissa}.0e{exponent}"
    whole, dot, fraction = mantissa.partition(".")
    if not dot or len(whole) != 16 or fraction != "0":
        return token
    figures = whole.rstrip("0")
    return f"{sign}{figures[0]}.{figures[1:] or '0'}e+15"


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads with hooks builds a new decoder for every call.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_not_json)


def loads_job(raw: str | bytes) -> dict[str, Any]:
    """Parse a queue entry. Raises PayloadError for anything that is not a job
    this process can run and write back."""
    try:
        if isinstance(raw, str):
            text = raw
        elif raw[:1] == b"{" and raw[1:2] != b"\x00":  # UTF-8: every payload a client writes
            text = raw.decode("utf-8")
        else:  # what json.loads accepts too: a BOM, UTF-16 or UTF-32
            text = raw.decode(json.detect_encoding(raw))
        job = _DECODER.decode(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("not JSON: nested too deep to decode") from None
    if not isinstance(job, dict):
        raise PayloadError(f"not a JSON object: {type(job).__name__}")
    if not isinstance(job.get("class"), str) or not isinstance(job.get("args"), list):
        raise PayloadError("missing a string 'class' or a list 'args'")
    # Only an escape can bring in a surrogate (the bytes were strict UTF-8),
    # and "\\ud" is rare in payloads: a plain one pays two substring searches.
    if ("\\ud" in text or "\\uD" in text or not isinstance(raw, bytes)) \
            and (where := unwritable_field(job)) is not None:
        raise PayloadError(f"not writable as UTF-8: {where} holds a lone surrogate")
    return job


def writable(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unwritable_field(job: dict[str, Any]) -> str | None:
    """The first field of ``job`` (``'args'``, or ``a key`` itself) that
    cannot be written as UTF-8, or None when the whole job can."""
    for key, value in job.items():
        if not writable(key):
            return f"a key {key!r:.60}"
        try:
            if not writable(compact_json(value)):
                return f"field {key!r:.60}"
        except (ValueError, TypeError, RecursionError):
            return f"field {key!r:.60}"
    return None


def check_text(value: str, where: str) -> None:
    """Refuse a string no worker could write back: one holding a lone surrogate."""
    if not writable(value):
        raise ArgumentError(f"{where} {value!r:.80} holds a lone surrogate, which UTF-8 "
                            "cannot carry (a surrogate-escaped file name? decode it first)")


# Exact types that need no look inside: most arguments, skipped without a call.
_PLAIN = frozenset({bool, type(None)})


def check_args(args: Any, where: str = "args") -> None:
    """Refuse anything JSON cannot carry unchanged; name the offending argument."""
    if isinstance(args, list):
        _check_items(args, where)
        return
    if isinstance(args, str):
        if not args.isascii():
            check_text(args, where)
        return
    if args is None or isinstance(args, bool):
        return
    if isinstance(args, int):
        _check_int(args, where)
        return
    if isinstance(args, float):
        if not math.isfinite(args):
            raise ArgumentError(f"{where} is {args!r}, which JSON cannot carry")
        return
    if isinstance(args, dict):
        _check_dict(args, where)
        return
    raise ArgumentError(
        f"{where} is a {type(args).__name__} ({args!r:.60}); job arguments must be "
        "JSON-native: str, int, float, bool, None, list or dict with str keys"
    )


def _check_dict(args: dict[Any, Any], where: str) -> None:
    for key, value in args.items():
        if not isinstance(key, str):
            raise ArgumentError(f"{where} has a non-string key {key!r}")
        if not key.isascii():
            check_text(key, f"{where} key")
        check_args(value, f"{where}[{key!r}]")


def _check_items(items: list[Any], where: str) -> None:
    for i, item in enumerate(items):
        kind = type(item)
        if kind is str:
            if not item.isascii():
                check_text(item, f"{where}[{i}]")
        elif kind is int:
            if item.bit_length() > _SAFE_INT_BITS:
                _check_int(item, f"{where}[{i}]")
        elif kind not in _PLAIN:
            check_args(item, f"{where}[{i}]")


# Python writes an int of at most sys.get_int_max_str_digits() digits (640 at
# the least, about 2,126 bits): a shorter one is always written.
_SAFE_INT_BITS = 2_000


def _check_int(value: int, where: str) -> None:
    """Refuse an int Python will not write as JSON, before anything is pushed."""
    if value.bit_length() <= _SAFE_INT_BITS:
        return
    try:
        str(value)
    except ValueError:
        raise ArgumentError(
            f"{where} is an integer of more than {sys.get_int_max_str_digits()} digits, "
            "which Python will not write as JSON") from None


def now_stamp(fmt: str, now: float | None = None) -> float | int:
    """A timestamp for a payload field: float seconds, or Sidekiq 8's int ms."""
    t = time.time() if now is None else now
    return int(t * 1000) if fmt == "ms" else t


def to_seconds(value: Any) -> float | None:
    """Read any Sidekiq timestamp: a JSON float is seconds, an integer is ms.

    A bare integer small enough to be seconds (before the year 2100 as
    seconds, i.e. under 4.1e9) is taken as seconds, for hand-written data.
    """
    if not is_number(value):
        return None
    try:
        seconds = value / 1000.0 if isinstance(value, int) and value > 4_102_444_800 \
            else float(value)
    except OverflowError:  # an integer beyond any float: no time at all
        return None
    # Python's json reads Infinity and NaN: no time either, and no reader's
    # arithmetic (a latency, a duration) may meet one.
    return seconds if math.isfinite(seconds) else None


def score(seconds: float) -> str:
    """A sorted-set score for a run-at time, written as Sidekiq does: a float string."""
    return repr(float(seconds))


def parse_item(value: bytes | str) -> dict[str, Any] | None:
    """The payload object, or None when the value is not a JSON object."""
    try:
        item = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return item if isinstance(item, dict) else None


def latency_of(oldest: bytes | None, now: float | None = None) -> float:
    """Seconds the oldest job has waited; 0 for an empty queue or a missing stamp."""
    item = parse_item(oldest) if oldest is not None else None
    enqueued = to_seconds(item.get("enqueued_at")) if item is not None else None
    if enqueued is None:
        return 0.0
    return (time.time() if now is None else now) - enqueued

"""A stored profile's bytes, checked before anything reads them.

Profiles live in Redis, and anything read from Redis is untrusted: a
crafted value must not exhaust memory, crash the reader, or reach
``marshal`` (which documents itself as unsafe on hostile input and can
build code objects). So wurk never calls ``marshal.loads`` or ``pstats`` on
profile data it did not first decode itself.

Duties:
1. :func:`gunzip`: unzip at most :data:`MAX_PROFILE_BYTES`; a larger or
   broken stream is refused, so a gzip bomb costs nothing.
2. :func:`decode_stats`: read the marshal dump of a cProfile stats table
   with a small decoder that knows only the types such a dump holds
   (dict, tuple, int, float, str and back-references), nests no deeper
   than that table does, and then checks its shape: ``(file, line, name)``
   to ``(calls, total calls, tottime, cumtime, callers)``. Anything else
   raises :class:`ProfileDataError`.
3. :func:`safe_file_name`: a file name for ``save`` that cannot leave its
   directory, whatever name Redis offered.
"""

from __future__ import annotations

import math
import re
import struct
import zlib
from collections.abc import Callable
from typing import Any

from wurk.core.validate import is_count, is_whole

# A heavy job's cProfile dump is a few MB; these leave room and stop abuse.
MAX_STORED_BYTES = 64 * 1024 * 1024
MAX_PROFILE_BYTES = 256 * 1024 * 1024
MAX_FILE_NAME = 200
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9_.-]")
# The table nests dict > tuple > dict > tuple > value: five levels.
_MAX_DEPTH = 5
_FLAG_REF = 0x80
_MAX_LONG_DIGITS = 5  # 75 bits: more than any count or line number needs
_PENDING = object()


class ProfileDataError(ValueError):
    """The stored profile is not one wurk can read; the message says why."""


def gunzip(raw: bytes, limit: int | None = None) -> bytes:
    """The single gzip member in ``raw``, refused past ``limit`` bytes unzipped
    (default :data:`MAX_PROFILE_BYTES`)."""
    limit = MAX_PROFILE_BYTES if limit is None else limit
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error:
        raise ProfileDataError("its data is not gzip") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise ProfileDataError(f"its data unzips to more than {limit} bytes")
    if not inflater.eof:
        raise ProfileDataError("its data is a truncated gzip stream")
    return data


def decode_stats(data: bytes) -> dict[tuple[str, int, str], tuple[Any, ...]]:
    """The pstats table in ``data``, decoded without ``marshal`` and checked."""
    reader = _Reader(data)
    table = reader.value(0)
    if reader.pos != len(data):
        raise ProfileDataError("its data has bytes after the profile")
    if not isinstance(table, dict):
        raise ProfileDataError("its data is not a cProfile table")
    checked: set[int] = set()  # a callers table shared by reference is checked once
    for entry in table.values():
        if not (isinstance(entry, tuple) and len(entry) == 5 and isinstance(entry[4], dict)):
            raise ProfileDataError("its data has an entry that is not a cProfile row")
        _check_numbers(entry[:4])
        if id(entry[4]) not in checked:
            checked.add(id(entry[4]))
            _check_callers(entry[4])
    return table


def _check_callers(callers: dict[Any, Any]) -> None:
    for numbers in callers.values():
        if not (isinstance(numbers, tuple) and len(numbers) == 4):
            raise ProfileDataError("its data has a caller that is not a cProfile row")
        _check_numbers(numbers)


def _check_function(func: Any) -> None:
    ok = (isinstance(func, tuple) and len(func) == 3 and isinstance(func[0], str)
          and is_whole(func[1]) and isinstance(func[2], str))
    if not ok:
        raise ProfileDataError("its data names a function other than as (file, line, name)")


def _check_numbers(numbers: tuple[Any, ...]) -> None:
    counts_ok = all(is_count(n) for n in numbers[:2])
    times_ok = all(isinstance(t, int | float) and math.isfinite(t) for t in numbers[2:])
    if not (counts_ok and times_ok):
        raise ProfileDataError("its data has counts or times that are not numbers")


class _Reader:
    """The marshal subset of a stats dump: dict, tuple, int, float, str, refs."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.refs: list[Any] = []

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ProfileDataError("its data is truncated")
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def number(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise ProfileDataError("its data nests deeper than a cProfile table")
        code = self.number("B")
        flagged, kind = code & _FLAG_REF, chr(code & ~_FLAG_REF)
        if kind == "r":
            return self.reference()
        slot = len(self.refs)
        if flagged:
            self.refs.append(_PENDING)  # marshal registers containers before their items
        result = self.build(kind, depth)
        if flagged:
            self.refs[slot] = result
        return result

    def reference(self) -> Any:
        index = self.number("<I")
        if index >= len(self.refs) or self.refs[index] is _PENDING:
            raise ProfileDataError("its data has a reference to nothing")
        return self.refs[index]

    def build(self, kind: str, depth: int) -> Any:
        builder = _BUILDERS.get(kind)
        if builder is None:
            raise ProfileDataError(f"its data holds a type a cProfile table never has "
                                   f"({kind!r})")
        return builder(self, depth)

    def items(self, size: int, depth: int) -> tuple[Any, ...]:
        return tuple(self.value(depth + 1) for _ in range(self.length(size)))

    def length(self, size: int) -> int:
        # Every item takes at least one byte: a bigger count is a lie.
        if size < 0 or size > len(self.data) - self.pos:
            raise ProfileDataError("its data is truncated")
        return size

    def text(self, size: int, encoding: str) -> str:
        try:
            return self.take(self.length(size)).decode(encoding)
        except UnicodeDecodeError:
            raise ProfileDataError("its data has text that is not valid") from None

    def long(self) -> int:
        count = self.number("<i")
        if not 0 < abs(count) <= _MAX_LONG_DIGITS:
            raise ProfileDataError("its data has an integer out of range")
        magnitude = 0
        for shift in range(abs(count)):
            digit = self.number("<H")
            if digit >= 1 << 15:
                raise ProfileDataError("its data has an integer that is not valid")
            magnitude |= digit << (15 * shift)
        return magnitude if count > 0 else -magnitude

    def mapping(self, depth: int) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        while self.data[self.pos:self.pos + 1] != b"0":
            key = self.value(depth + 1)
            _check_function(key)  # also makes it hashable
            result[key] = self.value(depth + 1)
        self.take(1)
        return result


# Marshal's type codes for what a stats dump holds (Python/marshal.c); the
# interned and non-interned spellings of a string read alike.
_BUILDERS: dict[str, Callable[[_Reader, int], Any]] = {
    "z": lambda r, _: r.text(r.number("B"), "ascii"),
    "Z": lambda r, _: r.text(r.number("B"), "ascii"),
    "a": lambda r, _: r.text(r.number("<i"), "ascii"),
    "A": lambda r, _: r.text(r.number("<i"), "ascii"),
    "u": lambda r, _: r.text(r.number("<i"), "utf-8"),
    "t": lambda r, _: r.text(r.number("<i"), "utf-8"),
    "i": lambda r, _: r.number("<i"),
    "g": lambda r, _: r.number("<d"),
    "l": lambda r, _: r.long(),
    ")": lambda r, depth: r.items(r.number("B"), depth),
    "(": lambda r, depth: r.items(r.number("<i"), depth),
    "{": lambda r, depth: r.mapping(depth),
}


def safe_file_name(stored: str, key: str) -> str:
    """``stored`` if it is a plain ``.prof`` name, else one made from ``key``.

    Plain: letters, digits, ``_``, ``.`` and ``-`` only, not starting with a
    dot, at most :data:`MAX_FILE_NAME` long; so no separator, no ``..``, no
    absolute path and no NUL can come from Redis.
    """
    if (len(stored) <= MAX_FILE_NAME and stored.endswith(".prof")
            and _SAFE_NAME.fullmatch(stored) and ".." not in stored):
        return stored
    base = _UNSAFE_CHAR.sub("_", key).lstrip("._")[: MAX_FILE_NAME - 5] or "profile"
    return f"{base}.prof"

"""Job profiles as an operator reads them: list, fetch, save as ``.prof``.

Duties:
1. Prune first, as Sidekiq 8's readers do: ``ZREMRANGEBYSCORE profiles -inf
   now`` drops keys whose expiry (their score) has passed.
2. List the profiles, newest first, as :class:`ProfileRecord` (the hash's
   fields without the data); a key whose hash already expired is skipped.
3. Fetch one by key, raising :class:`ProfileNotFoundError` when it is gone,
   and give its data unzipped, within size limits checked before the data
   is fetched: for wurk's ``cprofile`` type that is the pstats marshal
   dump; Sidekiq's Vernier profiles are gzip JSON and come out as JSON.
4. Read a ``cprofile`` table only through :mod:`wurk.wire.profile_data`,
   never ``marshal`` or ``pstats`` on the stored bytes: a crafted value is
   refused with :class:`ProfileDataError`.
5. Save one to a file (``.prof`` for cProfile: ``python -m pstats FILE`` and
   snakeviz open it) under a name that cannot leave the directory, never
   over an existing file or through a symlink; load it as
   :class:`pstats.Stats`, or list its top functions as :class:`FunctionStat`.
"""

from __future__ import annotations

import marshal
import os
import pstats
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.profile_data import (
    MAX_STORED_BYTES,
    ProfileDataError,
    decode_stats,
    gunzip,
    safe_file_name,
)
from wurk.wire.replies import resolve, text, to_float, to_int

FIELDS = ("started_at", "token", "type", "jid", "filename", "elapsed", "size")
# pstats' own sort names for the orders ``top`` offers.
SORTS = ("cumulative", "tottime", "calls")
Table = dict[tuple[str, int, str], tuple[Any, ...]]
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAMED_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


class ProfileNotFoundError(LookupError):
    """No profile is stored under that key (never written, or expired)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no profile {key!r} (it may have expired; see 'wurk profile list')")
        self.key = key


@dataclass(frozen=True)
class ProfileRecord:
    key: str
    token: str
    type: str
    jid: str
    filename: str
    started_at: float
    elapsed: float
    size: int
    expires_at: float

    @classmethod
    def from_fields(cls, key: str, values: list[Any], expires_at: float) -> ProfileRecord:
        row = dict(zip(FIELDS, values, strict=True))
        return cls(key=key, token=text(row["token"]), type=text(row["type"]),
                   jid=text(row["jid"]), filename=text(row["filename"]),
                   started_at=to_float(row["started_at"]), elapsed=to_float(row["elapsed"]),
                   size=to_int(row["size"]), expires_at=expires_at)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "token": self.token, "type": self.type, "jid": self.jid,
                "filename": self.filename, "started_at": self.started_at,
                "elapsed": self.elapsed, "size": self.size, "expires_at": self.expires_at}


@dataclass(frozen=True)
class FunctionStat:
    """One function's line in a profile, as ``python -m pstats`` prints it."""

    function: str  # "file:line(name)", or "{built-in ...}" for C functions
    calls: int
    primitive_calls: int
    tottime: float
    cumtime: float

    def sort_key(self, sort: str) -> float:
        return {"cumulative": self.cumtime, "tottime": self.tottime,
                "calls": float(self.calls)}[sort]


class ProfileSet:
    """The ``profiles`` ZSET and the hashes it indexes."""

    def __init__(self, *, config: Config | None = None) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)

    def prune(self, now: float | None = None) -> int:
        """Drop expired keys from the index; returns how many went."""
        stamp = repr(time.time() if now is None else now)
        # Replaying it later can only remove what has expired by then too.
        return int(self.runtime.pool.call("ZREMRANGEBYSCORE", keys.PROFILES, "-inf", stamp,
                                         idempotent=True))

    def __len__(self) -> int:
        self.prune()
        return int(self.runtime.pool.call("ZCARD", keys.PROFILES, idempotent=True))

    def __iter__(self) -> Iterator[ProfileRecord]:
        return iter(self.entries())

    def entries(self, limit: int = 100) -> list[ProfileRecord]:
        """Up to ``limit`` live profiles, the latest written first."""
        self.prune()
        reply = self.runtime.pool.call("ZREVRANGE", keys.PROFILES, 0, limit - 1, "WITHSCORES",
                                      idempotent=True)
        pairs = [(text(m), float(s)) for m, s in zip(reply[::2], reply[1::2], strict=True)]
        if not pairs:
            return []
        rows = self.runtime.pool.pipeline([("HMGET", key, *FIELDS) for key, _ in pairs],
                                         idempotent=True)
        return [ProfileRecord.from_fields(key, row, expires)
                for (key, expires), row in zip(pairs, rows, strict=True)
                if any(value is not None for value in row)]

    def fetch(self, key: str) -> ProfileRecord:
        expires, row = self.runtime.pool.pipeline(
            [("ZSCORE", keys.PROFILES, key), ("HMGET", key, *FIELDS)], idempotent=True)
        if all(value is None for value in row):
            raise ProfileNotFoundError(key)
        return ProfileRecord.from_fields(key, row, to_float(expires))

    def data(self, key: str) -> bytes:
        """The profile's data, unzipped (a pstats dump for ``cprofile``)."""
        # The size first: a value too big to use is never fetched.
        size = int(self.runtime.pool.call("HSTRLEN", key, "data", idempotent=True))
        if size > MAX_STORED_BYTES:
            raise ProfileDataError(f"cannot read profile {key!r}: its data is larger than "
                                   f"{MAX_STORED_BYTES} bytes")
        raw = self.runtime.pool.call("HGET", key, "data", idempotent=True)
        if raw is None:
            raise ProfileNotFoundError(key)
        try:
            return gunzip(raw)
        except ProfileDataError as exc:
            raise ProfileDataError(f"cannot read profile {key!r}: {exc}") from None

    def table(self, key: str) -> Table:
        """A ``cprofile`` profile's stats table, decoded and checked without marshal."""
        record = self.fetch(key)
        if record.type != "cprofile":
            raise ValueError(f"profile {key!r} is of type {record.type!r}, not cprofile")
        data = self.data(key)
        try:
            return decode_stats(data)
        except ProfileDataError as exc:
            raise ProfileDataError(f"cannot read profile {key!r}: {exc}") from None

    def save(self, key: str, path: str | os.PathLike[str]) -> Path:
        """Write the profile to ``path``; a directory gets a new file named for the profile.

        A ``cprofile`` profile is decoded and checked, then written as a
        fresh marshal dump of the checked table, so the file pstats later
        opens holds nothing the check did not see.
        """
        record = self.fetch(key)
        data = marshal.dumps(self.table(key)) if record.type == "cprofile" else self.data(key)
        target = Path(path)
        if not target.is_dir():
            _write(_NAMED_FILE, target, data)
            return target
        name = safe_file_name(record.filename, key)
        folder = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _write(_NEW_FILE, Path(name), data, dir_fd=folder)
        finally:
            os.close(folder)
        return target / name

    def stats(self, key: str, stream: TextIO | None = None) -> pstats.Stats:
        """A cProfile profile loaded as :class:`pstats.Stats` (printing to ``stream``)."""
        return pstats.Stats(_Loaded(self.table(key)), stream=stream)  # type: ignore[arg-type]

    def top(self, key: str, *, sort: str = "cumulative", limit: int = 25) -> list[FunctionStat]:
        """The ``limit`` functions that weigh most by ``sort`` (one of :data:`SORTS`)."""
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
        table = self.table(key)
        rows = [FunctionStat(name if file == "~" else f"{file}:{line}({name})",
                             calls, primitive, tottime, cumtime)
                for (file, line, name), (primitive, calls, tottime, cumtime, _) in table.items()]
        rows.sort(key=lambda row: row.sort_key(sort), reverse=True)
        return rows[:limit]


class _Loaded:
    """What :class:`pstats.Stats` takes in place of a profiler: a checked table."""

    def __init__(self, table: Table) -> None:
        self.stats = table

    def create_stats(self) -> None:
        """Nothing to do: the table is already complete."""


def _write(flags: int, path: Path, data: bytes, dir_fd: int | None = None) -> None:
    try:
        fd = os.open(path, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        raise ValueError(f"{path} already exists; not overwriting it") from None
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)

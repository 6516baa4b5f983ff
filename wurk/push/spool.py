"""The push spool: buffered pushes that outlive their process, on local disk.

A process that exits while Redis is unreachable (or refusing writes during a
failover) writes what its push buffer still holds here instead of dropping
it; :mod:`wurk.push.spool_drain` pushes it later. One file per process exit:

    <dir>/<written_ns>-<pid>-<rand>.spool             waiting
    <dir>/<written_ns>-<pid>-<rand>.spool.claim-<pid>  claimed by a drainer
    <dir>/<written_ns>-<pid>-<rand>.spool.bad          unreadable, moved aside

A file is JSON lines: a header (format version, the Redis it belongs to,
the writer's pid, when, how many jobs), then one job per line with the
nonce of the push it came in (pushes go in through PUSH_ONCE, so a replay
with that nonce is a no-op while the job's marker lives).

Duties:
1. Name the directory (``spool_dir``, else ``$XDG_STATE_HOME/wurk/spool``,
   else ``~/.local/state/wurk/spool``) and the Redis a file belongs to.
2. Write a file durably: temporary name, fsync, rename, fsync of the
   directory; mode 0600 in a 0700 directory.
3. Read a file as untrusted input: every line bounded, every field checked,
   the header's count matched; any flaw is a :class:`SpoolFormatError`
   naming the line, never another exception.
4. Claim a file for exactly one drainer (an exclusive ``flock`` taken
   before the rename to the claimer's name, so a dead claimer's file can be
   taken over), move a bad one aside, delete a finished one, and give one
   that could not be pushed back under its waiting name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from wurk.core.validate import is_count, is_number, is_text
from wurk.push.time_options import MAX_EPOCH

if TYPE_CHECKING:
    from wurk.settings.config import Config

FORMAT = 1
# Redis's own ceiling for one value (proto-max-bulk-len): no job it could
# take is longer, and no line is read past it.
LINE_MAX = 512 * 1024 * 1024
FIELD_MAX = 1024
_NAME = re.compile(r"^(?P<base>\d{20}-\d+-[0-9a-f]{6})\.spool"
                   r"(?:\.claim-(?P<claimer>\d+)|(?P<bad>\.bad))?$")
_NONCE = re.compile(r"^[0-9a-f]{8,64}$")


class SpoolFormatError(ValueError):
    """A spool file is not one we can push; the message names the line and the flaw."""


def default_dir() -> Path:
    """The XDG state directory: kept across reboots (unlike /tmp), per user,
    writable without root (unlike /var/spool)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".local", "state")
    return Path(state) / "wurk" / "spool"


def spool_dir(config: Config) -> Path:
    return Path(config.spool_dir) if config.spool_dir else default_dir()


def target_of(config: Config) -> str:
    """The Redis a push was meant for, without credentials: files are only
    drained into the same one."""
    if config.sentinels:
        return f"sentinel://{config.sentinel_master}/{_db(config.redis_url)}"
    parts = urlsplit(config.redis_url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}/{_db(config.redis_url)}"
    return f"redis://{parts.hostname or 'localhost'}:{parts.port or 6379}/{_db(config.redis_url)}"


def _db(url: str) -> str:
    parts = urlsplit(url)
    query = parse_qs(parts.query).get("db")
    if query:
        return query[0]
    path = parts.path.strip("/") if parts.scheme != "unix" else ""
    return path if path.isdigit() else "0"


@dataclass(frozen=True)
class Destination:
    """Where a process spools: the directory and the Redis its files belong to."""

    directory: Path
    target: str

    @classmethod
    def of(cls, config: Config) -> Destination:
        return cls(spool_dir(config), target_of(config))


@dataclass(frozen=True)
class SpoolEntry:
    nonce: str
    jid: str
    queue: str
    at: float | None
    job: str


@dataclass(frozen=True)
class SpoolHeader:
    target: str
    pid: int
    written_at: float
    jobs: int


# -- writing ------------------------------------------------------------------------
def spool_name() -> str:
    """A new file's name without ``.spool``: sorts by time, unique per process."""
    return f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}"


def write_spool(directory: Path, target: str, entries: Iterable[SpoolEntry],
                name: str | None = None) -> Path:
    """Write one spool file atomically and durably; returns its path. ``name``
    (from :func:`spool_name`) when the file was named before it was written."""
    lines = [json.dumps({"nonce": e.nonce, "jid": e.jid, "queue": e.queue, "at": e.at,
                         "job": e.job}) for e in entries]
    header = json.dumps({"wurk_spool": FORMAT, "target": target, "pid": os.getpid(),
                         "written_at": time.time(), "jobs": len(lines)})
    _make_dir(directory)
    base = name or spool_name()
    tmp, final = directory / f".{base}.tmp", directory / f"{base}.spool"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("\n".join([header, *lines]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _sync_dir(directory)
    return final


def _make_dir(directory: Path) -> None:
    if directory.is_dir():
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _sync_dir(directory.parent)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading ------------------------------------------------------------------------
def read_header(fh: IO[bytes]) -> SpoolHeader:
    doc = _line_json(fh, 1)
    if doc is None or doc.get("wurk_spool") != FORMAT:
        raise SpoolFormatError(f"line 1: not a wurk spool header (format {FORMAT})")
    target, pid, written, jobs = (doc.get(k) for k in ("target", "pid", "written_at", "jobs"))
    if not (_text(target) and _count(pid) and _number(written) and _count(jobs)):
        raise SpoolFormatError("line 1: header needs target, pid, written_at and jobs")
    return SpoolHeader(str(target), int(pid), float(written), int(jobs))  # type: ignore[arg-type]


def read_entries(fh: IO[bytes], header: SpoolHeader) -> Iterator[SpoolEntry]:
    """Every job after the header, checked; raises at the first flaw or a count
    that differs from the header's (a truncated file)."""
    number = 1
    while True:
        number += 1
        doc = _line_json(fh, number)
        if doc is None:
            break
        yield parse_entry(doc, number)
    if number - 2 != header.jobs:
        raise SpoolFormatError(f"holds {number - 2} jobs, its header says {header.jobs} "
                               "(truncated?)")


def _line_json(fh: IO[bytes], number: int) -> dict[str, Any] | None:
    """The JSON object on the next line; None at the end of the file."""
    raw = fh.readline(LINE_MAX + 1)
    if not raw:
        return None
    if len(raw) > LINE_MAX:
        raise SpoolFormatError(f"line {number}: longer than {LINE_MAX} bytes")
    if not raw.endswith(b"\n"):
        raise SpoolFormatError(f"line {number}: cut short (no newline)")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SpoolFormatError(f"line {number}: not JSON") from None
    if not isinstance(doc, dict):
        raise SpoolFormatError(f"line {number}: not a JSON object")
    return doc


def parse_entry(doc: dict[str, Any], number: int) -> SpoolEntry:
    nonce, jid, queue, at, job = (doc.get(k) for k in ("nonce", "jid", "queue", "at", "job"))
    if not (isinstance(nonce, str) and _NONCE.match(nonce)):
        raise SpoolFormatError(f"line {number}: nonce must be 8 to 64 hex digits")
    if not (_text(jid) and _text(queue)):
        raise SpoolFormatError(f"line {number}: jid and queue must be short non-empty strings")
    if at is not None and not _number(at):
        raise SpoolFormatError(f"line {number}: at must be null or epoch seconds")
    if not (isinstance(job, str) and _is_job(job, jid, queue)):
        raise SpoolFormatError(f"line {number}: job is not a payload with this jid and queue")
    return SpoolEntry(nonce, str(jid), str(queue), None if at is None else float(at), job)


def _is_job(raw: str, jid: Any, queue: Any) -> bool:
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return (isinstance(payload, dict) and _text(payload.get("class"))
            and isinstance(payload.get("args"), list)
            and payload.get("jid") == jid and payload.get("queue") == queue)


def _text(value: Any) -> bool:
    return is_text(value, FIELD_MAX)


def _count(value: Any) -> bool:
    return is_count(value)


def _number(value: Any) -> bool:
    """Epoch seconds a push would take (NaN fails both comparisons, as infinity does one)."""
    return is_number(value) and 0 <= value < MAX_EPOCH


# -- the directory ------------------------------------------------------------------
@dataclass(frozen=True)
class SpoolName:
    path: Path
    base: str
    claimer: int | None
    bad: bool

    @property
    def state(self) -> str:
        return "bad" if self.bad else "claimed" if self.claimer is not None else "waiting"


def spool_files(directory: Path) -> list[SpoolName]:
    """The spool files in ``directory``, oldest first; other names are left alone."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        if match:
            claimer = match["claimer"]
            found.append(SpoolName(directory / name, match["base"],
                                   int(claimer) if claimer else None, bool(match["bad"])))
    return sorted(found, key=lambda f: f.base)


class Claim:
    """One spool file held by this process: an open, exclusively locked file
    renamed to this process's claim name."""

    def __init__(self, fd: int, path: Path, base: str) -> None:
        self.fd = fd
        self.path = path
        self.base = base
        _held.add(fd)

    @property
    def name(self) -> str:
        """The file's name as it was written (before any claim)."""
        return f"{self.base}.spool"

    def reader(self) -> IO[bytes]:
        os.lseek(self.fd, 0, os.SEEK_SET)
        return os.fdopen(os.dup(self.fd), "rb")

    def finish(self) -> None:
        """Every job is in: delete the file, then let go of it."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        _sync_dir(self.path.parent)
        self._let_go()

    def move_aside(self) -> Path:
        bad = self.path.with_name(f"{self.base}.spool.bad")
        os.rename(self.path, bad)
        self._let_go()
        return bad

    def release(self) -> None:
        """Let go without deleting: back under its waiting name (renamed while
        still locked), for the next drain."""
        with contextlib.suppress(OSError):
            os.rename(self.path, self.path.with_name(self.name))
        self._let_go()

    def _let_go(self) -> None:
        if self.fd in _held:
            _held.discard(self.fd)
            os.close(self.fd)


def claim(name: SpoolName) -> Claim | None:
    """Take ``name`` for this process, or None if another live process holds it
    or it is gone. The lock comes before the rename: a claim name whose file
    is unlocked belongs to a process that died, and may be taken over."""
    try:
        fd = os.open(name.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mine = name.path.with_name(f"{name.base}.spool.claim-{os.getpid()}")
        os.rename(name.path, mine)
        if os.stat(mine).st_ino != os.fstat(fd).st_ino:
            raise FileNotFoundError(mine)
    except OSError:
        # Locked by a live drainer, or finished and renamed away meanwhile.
        os.close(fd)
        return None
    return Claim(fd, mine, name.base)


# Descriptors of held claims: a forked child closes its copies so that only
# the process that claimed a file keeps it locked.
_held: set[int] = set()


def forget_after_fork() -> None:
    """In a forked child: close our copies of the parent's claim locks."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


"""Reading a settings file a person named: a regular file of bounded size, or a clear error.

``wurk run -C FILE`` and ``wurk-swarm -t FILE`` take any path. A FIFO would
block the open forever and a device such as ``/dev/zero`` never ends, so a
file is opened without blocking, must be a regular file, and is read only up
to :data:`MAX_BYTES`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_BYTES = 1024 * 1024  # a topology of thousands of slots is still far below this


class SettingsFileError(ValueError):
    """The path cannot be read as a settings file; the message says why in one line."""


def read_settings_file(path: Path) -> str:
    """The UTF-8 text of ``path``; raises SettingsFileError, OSError or UnicodeDecodeError."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of hanging.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SettingsFileError(f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > MAX_BYTES:
            raise SettingsFileError(f"{info.st_size} bytes, more than the {MAX_BYTES} allowed")
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:  # grew while we read it
        raise SettingsFileError(f"more than the {MAX_BYTES} bytes allowed")
    return data.decode("utf-8")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")

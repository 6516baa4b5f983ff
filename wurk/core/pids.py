"""Whether a process id names a live process, asked without disturbing it."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Signal 0 checks without sending; a process we may not signal still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""Loading the application's job modules (``require``) before work starts.

A worker, and the swarm parent before it forks, imports each module named in
``require`` so that its ``@wurk.job`` functions register. This lives in the
runtime, not the CLI, so the swarm parent loads jobs without importing the
admin CLI and API.

Duties:
1. Import by dotted name or by ``.py`` path, from the current directory. A
   path is imported under the dotted name the same file has when imported
   normally (its parent directories that are packages, up to the first that
   is not, whose directory goes on ``sys.path``), so its jobs register under
   the names a client that imports the module pushes; a path that cannot
   have such a name is refused with the ``-r`` value to use.
2. Turn any error a module raises while importing into an ImportError that
   names the module, so the entry points report it as a configuration error.
   Its one line names the user's own line that failed (the innermost frame
   outside importlib, the standard library, installed packages and wurk):
   for a missing name, the module of the application that imported it. The
   whole traceback goes to the log at debug level (``--log-level debug``).
3. :func:`require_jobs`: refuse to start a worker with no job of the
   application registered. It would fetch every job of its queues and fail
   each one as unknown; an entry point exits with its configuration status.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from wurk.core.logging import get_logger
from wurk.push.job import Registry, registry

log = get_logger("wurk.launcher")
NO_JOBS_HINT = ("no job class is registered: name the modules that define jobs with "
                "-r/--require (or require = [...])")
# Frames from here are not the user's: the import machinery, installed
# packages, the standard library and wurk itself.
_NOT_THE_USERS = tuple({str(Path(p).resolve()) + os.sep for p in (
    *(sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    str(Path(__file__).resolve().parents[1]))})


class NoJobsError(RuntimeError):
    """A worker was asked to start with no job of the application registered."""


def load_modules(names: Sequence[str]) -> list[ModuleType]:
    """Import each job module, by dotted name or by .py path, from the current directory."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = []
    for name in names:
        try:
            modules.append(_import_one(name))
        except Exception as exc:
            log.debug("jobs.import_failed", module=name, exc_info=exc)
            failure = _failure(name, exc)
            if failure is None:
                raise  # the module itself is missing: its own message says it all
            raise failure from exc
    return modules


def _failure(name: str, exc: Exception) -> ImportError | None:
    """The one-line error for ``exc``, raised importing ``name`` (None: ``exc`` as it is)."""
    frame = user_frame(exc)
    if isinstance(exc, ImportError) and frame is None:
        return None
    at = f" (at {frame})" if frame else ""
    return ImportError(f"{name}: {type(exc).__name__}: {exc}{at}")


def user_frame(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``exc`` in the application's code."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename
        if not path.startswith("<") and not str(Path(path).resolve()).startswith(_NOT_THE_USERS):
            return f"{_shown(path)}:{frame.lineno}"
    return None


def _shown(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _import_one(name: str) -> ModuleType:
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    if not path.is_file():
        raise ImportError(f"{name}: no such file")
    dotted, root = dotted_name(path)
    if not all(part.isidentifier() for part in dotted.split(".")):
        raise ImportError(f"{name}: {dotted!r} is not a name Python can import; rename "
                          "the file (or its package directory) to a valid module name")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module(dotted)
    found = getattr(module, "__file__", None)
    if found is None or Path(found).resolve() != path:
        raise ImportError(f"{name}: the module {dotted!r} is {found or 'a namespace'}, not "
                          f"{path}; use -r {dotted} with the right directory on PYTHONPATH")
    return module


def dotted_name(path: Path) -> tuple[str, Path]:
    """The module name ``path`` has when imported normally, and the directory
    that must be on ``sys.path`` for it: parent directories count as long as
    they are packages (hold an ``__init__.py``)."""
    parts = [] if path.stem == "__init__" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file() and directory.parent != directory:
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts), directory


def require_jobs(jobs: Registry = registry, *, hint: str = NO_JOBS_HINT) -> list[str]:
    """The registered job names; raises :class:`NoJobsError` (and logs
    ``launcher.no_jobs`` with ``hint``) when none is the application's own."""
    names = jobs.names()
    if not [name for name in names if not wurks_own(jobs, name)]:
        log.error("launcher.no_jobs", hint=hint)
        raise NoJobsError(hint)
    return names


def wurks_own(jobs: Registry, name: str) -> bool:
    """A job wurk itself defines (``wurk.workflow.advance``): registered by ``import wurk``."""
    entry = jobs.find(name)
    return entry is not None and entry.origin.startswith("wurk.")

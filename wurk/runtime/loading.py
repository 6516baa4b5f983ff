"""Loading the application's job modules (``require``) before work starts.

A worker, and the swarm parent before it forks, imports each module named in
``require`` so that its ``@wurk.job`` functions register. This lives in the
runtime, not the CLI, so the swarm parent loads jobs without importing the
admin CLI and API.

Duties:
1. Import by dotted name or by ``.py`` path, from the current directory.
2. Turn any error a module raises while importing into an ImportError that
   names the module, so the entry points report it as a configuration error.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


def load_modules(names: Sequence[str]) -> list[ModuleType]:
    """Import each job module, by dotted name or by .py path, from the current directory."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    modules = []
    for name in names:
        try:
            modules.append(_import_one(name))
        except ImportError:
            raise
        except Exception as exc:
            raise ImportError(f"{name}: {type(exc).__name__}: {exc}") from exc
    return modules


def _import_one(name: str) -> ModuleType:
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None or not path.exists():
        raise ImportError(f"{name}: no such file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module

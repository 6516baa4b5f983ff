"""Old import paths of modules that moved into layered packages.

wurk 0.1 kept every module flat under ``wurk/``; the layered layout
(``wurk.settings``, ``wurk.redis``, ``wurk.wire``, ``wurk.push``,
``wurk.runtime`` ...) replaced it. For one release, ``import wurk.config``
and the other old paths still work: they give the moved module itself (same
object, so patching it patches the real one) and warn with a
DeprecationWarning that names the new path.

Duties:
1. Hold the table of moves, old dotted name -> new dotted name.
2. Resolve an old name at import time through a meta-path finder installed
   by ``wurk/__init__.py``, warning once per import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "wurk.logging": "wurk.core.logging",
    "wurk.redaction": "wurk.core.redaction",
    "wurk.threads": "wurk.core.threads",
    "wurk.pids": "wurk.core.pids",
    "wurk.config": "wurk.settings.config",
    "wurk.config_checks": "wurk.settings.checks",
    "wurk.limits": "wurk.settings.limits",
    "wurk.redis_url": "wurk.settings.redis_url",
    "wurk.queues": "wurk.settings.queues",
    "wurk.redis_pool": "wurk.redis.pool",
    "wurk.redis_limits": "wurk.redis.limits",
    "wurk.redis_wait": "wurk.redis.wait",
    "wurk.keys": "wurk.wire.keys",
    "wurk.lua": "wurk.wire.lua",
    "wurk.payload": "wurk.wire.payload",
    "wurk.api.activejob": "wurk.wire.activejob",
    "wurk.api.profile_data": "wurk.wire.profile_data",
    "wurk.metrics": "wurk.observe.metrics",
    "wurk.profiler": "wurk.observe.profiler",
    "wurk.client": "wurk.push.client",
    "wurk.buffered": "wurk.push.buffered",
    "wurk.confirmed": "wurk.push.confirmed",
    "wurk.spool": "wurk.push.spool",
    "wurk.spool_drain": "wurk.push.spool_drain",
    "wurk.job": "wurk.push.job",
    "wurk.signatures": "wurk.push.signatures",
    "wurk.launcher": "wurk.runtime.launcher",
    "wurk.manager": "wurk.runtime.manager",
    "wurk.processor": "wurk.runtime.processor",
    "wurk.fetch": "wurk.runtime.fetch",
    "wurk.reliable_fetch": "wurk.runtime.reliable_fetch",
    "wurk.private_lists": "wurk.runtime.private_lists",
    "wurk.settle": "wurk.runtime.settle",
    "wurk.reaper": "wurk.runtime.reaper",
    "wurk.scheduled": "wurk.runtime.scheduled",
    "wurk.retry": "wurk.runtime.retry",
    "wurk.heartbeat": "wurk.runtime.heartbeat",
    "wurk.embedded": "wurk.runtime.embedded",
    "wurk.middleware": "wurk.runtime.middleware",
    "wurk.health": "wurk.runtime.health",
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new_name}; the old path goes away in the "
                      "next release", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        # Already executed under its new name; running it again would make a copy.
        return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())

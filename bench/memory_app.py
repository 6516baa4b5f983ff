"""The preloaded application of the memory benchmark (bench/memory.py).

Imports a handful of standard-library packages a web app would, plus a
generated module of several hundred KB, and defines the benchmark's job.
"""

from __future__ import annotations

import asyncio  # noqa: F401 - imported for their size, as an app would
import decimal  # noqa: F401
import email.mime.multipart  # noqa: F401
import gc
import http.client  # noqa: F401
import importlib.util
import os
import sqlite3  # noqa: F401
import urllib.request  # noqa: F401
import xml.etree.ElementTree  # noqa: F401
from pathlib import Path

import redis

import wurk

_spec = importlib.util.spec_from_file_location(
    "memory_app_generated", Path(__file__).with_name(".memory_app_generated.py"))
assert _spec is not None and _spec.loader is not None
generated = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generated)

# Long-lived objects built at import time, as caches and registries are.
CACHE = [generated.TABLE[f"key{i}"] + (str(i) * 3,) for i in range(len(generated.TABLE))]
_collected: set[int] = set()
_client: redis.Redis | None = None


@wurk.job(name="MemoryChurn")
def churn(n: int) -> None:
    """Allocate and drop objects, then (once per process) a full collection."""
    global _client  # noqa: PLW0603 - one client per child process
    garbage = [{"n": i, "s": str(i)} for i in range(5000)]
    del garbage
    if os.getpid() not in _collected:
        _collected.add(os.getpid())
        gc.collect()
    if _client is None:
        _client = redis.Redis.from_url(os.environ["REDIS_URL"])
    _client.incr("bench:memory:done")

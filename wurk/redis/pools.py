"""The process's Redis pools, one per Config, built on first use.

A Config holds values only; the live pool for it is looked up here, so a
config can be copied, compared and printed without a socket attached, and a
forked child (whose inherited pools forget their sockets) builds new
connections on first use.

Duties:
1. ``pool_for(config)``: the pool for this config object, built lazily and
   kept while the config lives.
2. ``close_pool(config)``: close and forget it (the swarm parent before it
   forks, tests between servers, and ``wurk.configure`` for the default it
   replaces).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from wurk.redis.pool import RedisPool
from wurk.settings.config import when_default_replaced

if TYPE_CHECKING:
    from wurk.settings.config import Config

# Keyed by id(): Config is a mutable dataclass (unhashable); a finalizer
# drops the entry when the config is collected, before its id can be reused.
_pools: dict[int, RedisPool] = {}
_building = threading.Lock()


def pool_for(config: Config) -> RedisPool:
    """The pool this process uses for ``config``."""
    pool = _pools.get(id(config))
    if pool is None:
        with _building:
            pool = _pools.get(id(config))
            if pool is None:
                pool = RedisPool.from_config(config)
                _pools[id(config)] = pool
                weakref.finalize(config, _pools.pop, id(config), None)
    return pool


def close_pool(config: Config) -> None:
    """Close ``config``'s pool, if one was built; the next use builds a fresh one."""
    pool = _pools.pop(id(config), None)
    if pool is not None:
        pool.close()


when_default_replaced(close_pool)

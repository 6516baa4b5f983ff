"""The async Redis pools behind ``async with limiter.acquire()``, one per loop and limiter.

A pool belongs to the event loop that made it, so each limiter keeps one per
loop, made on its first async check there and made again when a later
``wurk.configure`` gives a module-level limiter a new config. Nothing here
imports asyncio until an async check runs (``import wurk`` stays free of it).

Duties:
1. :func:`pool`: the running loop's pool for a limiter.
2. :func:`aclose`: close the running loop's limiter pools (an app's lifespan
   end does, as it closes the loop's AsyncClient).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING

from wurk.redis.apool import AsyncRedisPool

if TYPE_CHECKING:
    from wurk.settings.config import Config

# Per loop, per limiter (by id, the owner kept alongside so the id stays its
# own): the config the pool was made for, and the pool.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                  dict[int, tuple[object, Config, AsyncRedisPool]]] = (
    weakref.WeakKeyDictionary())


def pool(owner: object, config: Config) -> AsyncRedisPool:
    mine = _pools.setdefault(asyncio.get_running_loop(), {})
    held = mine.get(id(owner))
    if held is None or held[0] is not owner or held[1] is not config:
        held = mine[id(owner)] = (owner, config, AsyncRedisPool.from_config(config))
    return held[2]


async def aclose() -> None:
    """Close every limiter pool of the running loop; the next async check makes a new one."""
    for _, _, made in _pools.pop(asyncio.get_running_loop(), {}).values():
        await made.close()

"""The per-process runtime: what one Config opens in this process.

A :class:`~wurk.settings.config.Config` holds values and is frozen; a
:class:`Runtime` holds the live state those values give: the Redis pool, the
asyncio pools (one per event loop, built there on first use), the pool of
blocking waits, and the clock.
It sits at the Redis layer so the push side, the admin API and the worker
can all be handed one.

Duties:
1. ``Runtime(config)``: built once at boot (a Launcher, a swarm child, a CLI
   command, a ``Client``) and passed to what needs it, so a call that takes a
   runtime does its I/O on a pool it was given, never on one it looks up.
2. :func:`runtime_for`: the process's runtime for a config, for the public
   APIs that take a Config (``Client(config=...)``, the ``wurk.api`` classes,
   a swarm's ``Slot``) and look it up once, when they are built; a module
   function that takes one (``peek``, ``Queue.all``, ``redis_info``,
   ``current_holder``) looks it up on entry, and a limiter at each use, as
   its config follows ``wurk.configure``. Keyed by the config's identity,
   not its value: two equal configs made apart (a test's, the admin CLI's)
   each close their own sockets, and a config's hook lists, which an
   integration extends in place, are no part of a key. A frozen config keeps
   its values for as long as its runtime lives, so the runtime never serves
   settings other than those it was built from.
3. :func:`close_runtime`: close and forget a config's runtime (the swarm
   parent before it forks, the admin CLI when done, ``wurk.configure`` for
   the default it replaces); the next lookup builds a fresh one.
4. :func:`forget_after_fork`: in a forked child, every Redis pool abandons
   its parent's sockets and every runtime its asyncio pools (their loops
   stayed in the parent). :mod:`wurk.runtime.forking` calls it, the one
   place a child resets.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wurk.redis import pool as sync_pools
from wurk.redis.pool import RedisPool
from wurk.settings.config import when_default_replaced

if TYPE_CHECKING:
    from wurk.redis.apool import AsyncRedisPool
    from wurk.settings.config import Config

__all__ = ["WAIT_CONNECTIONS", "Runtime", "close_runtime", "forget_after_fork", "handed",
           "runtime_for"]

# A process's blocking waits (results) per config: each holds a connection while it waits.
WAIT_CONNECTIONS = 64


class Runtime:
    """One config's pools and clock in this process."""

    def __init__(self, config: Config, *, pool: RedisPool | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.pool = pool if pool is not None else RedisPool.from_config(config)
        self.clock = clock
        self._waits: RedisPool | None = None
        self._waits_lock = threading.Lock()
        # Loop -> its pool: an asyncio pool's connections belong to one loop.
        self._apools: weakref.WeakKeyDictionary[Any, AsyncRedisPool] = (
            weakref.WeakKeyDictionary())
        _live.add(self)

    def wait_pool(self) -> RedisPool:
        """The pool blocking waits use (a result's BLPOP), built on first use:
        apart from :attr:`pool`, so waits under way never take the connections
        pushes and jobs need. :data:`WAIT_CONNECTIONS` at the most."""
        made = self._waits
        if made is None:
            with self._waits_lock:
                made = self._waits
                if made is None:
                    made = RedisPool.from_config(self.config)
                    made.size = WAIT_CONNECTIONS
                    self._waits = made
        return made

    def apool(self) -> AsyncRedisPool:
        """The running event loop's asyncio pool for this config, built there on first use."""
        # Imported here: ``import wurk`` stays free of asyncio.
        import asyncio  # noqa: PLC0415

        from wurk.redis.apool import AsyncRedisPool  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        made = self._apools.get(loop)
        if made is None:
            made = self._apools[loop] = AsyncRedisPool.from_config(self.config)
        return made

    def async_pools(self) -> list[AsyncRedisPool]:
        """The asyncio pools built so far, one per event loop that asked."""
        return list(self._apools.values())

    def close(self) -> None:
        """Close the idle sync connections; the pools stay usable and dial again."""
        self.pool.close()
        if self._waits is not None:
            self._waits.close()

    def after_fork_in_child(self) -> None:
        self.pool.after_fork_in_child()
        if self._waits is not None:
            self._waits.after_fork_in_child()
        self._waits_lock = threading.Lock()
        self._apools = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"Runtime({self.config!r})"


_live: weakref.WeakSet[Runtime] = weakref.WeakSet()
# By id(): a finalizer drops the entry when its config is collected, before
# the id can be reused.
_runtimes: dict[int, Runtime] = {}
_building = threading.Lock()


def runtime_for(config: Config) -> Runtime:
    """The runtime this process uses for ``config``, built on first use."""
    found = _runtimes.get(id(config))
    if found is None:
        with _building:
            found = _runtimes.get(id(config))
            if found is None:
                found = _runtimes[id(config)] = Runtime(config)
                weakref.finalize(config, _runtimes.pop, id(config), None)
    return found


def handed(runtime: Runtime | None, config: Config) -> Runtime:
    """The runtime an owner handed down, else the process's for ``config``.

    For the runtime's parts (a fetcher, the heartbeat ...), which a Launcher
    builds with its runtime and a test may build with a config alone: the
    lookup happens once, here, when the part is built.
    """
    return runtime if runtime is not None else runtime_for(config)


def close_runtime(config: Config) -> None:
    """Close ``config``'s runtime, if one was built; the next lookup builds a fresh one."""
    found = _runtimes.pop(id(config), None)
    if found is not None:
        found.close()


def forget_after_fork() -> None:
    """In a forked child: abandon every inherited socket, sync and asyncio."""
    global _building  # noqa: PLW0603 - a lock a thread left behind in the parent
    # A parent's thread may have been building a runtime at the fork: that
    # thread is not here to release the lock it held.
    _building = threading.Lock()
    sync_pools.forget_after_fork()
    for each in list(_live):
        each.after_fork_in_child()


when_default_replaced(close_runtime)

"""Workers inside an ASGI app's process, and pushes from async handlers.

Works with any ASGI framework (Starlette, FastAPI, a bare ASGI callable)
and imports none of them.

Duties:
1. :class:`Workers`: a hosted swarm (``supervisor.hosting.HostedSwarm``, from
   a topology) or an embedded worker (``wurk.runtime.embedded.Embedded``,
   threads in this process), started at the app's startup and drained at
   its shutdown. Both run in a worker thread (``asyncio.to_thread``): a
   drain can take ``shutdown_timeout`` and the event loop keeps serving
   meanwhile.
2. :func:`lifespan`: the ``lifespan=`` of Starlette and FastAPI (an async
   context manager per app), or one to enter inside your own.
3. :func:`with_workers`: the same for a bare ASGI app: it answers the
   ``lifespan`` messages itself and hands every other scope to the app.
4. At the end of the app's lifespan, close the loop's default
   :class:`wurk.AsyncClient` (the one ``await job.aperform_async(...)``
   pushes through in async handlers), so its buffered pushes are flushed,
   or spooled, while the loop still runs, and the loop's limiter pools.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from supervisor.hosting import HostedSwarm
from supervisor.topology import Topology
from wurk.limiter.awaiting import aclose as close_limiter_pools
from wurk.push.aclient import close_default
from wurk.runtime.embedded import Embedded
from wurk.settings.config import Config

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Workers:
    """One app's workers: a swarm from ``topology``, or ``embedded=True`` threads."""

    def __init__(self, topology: str | Path | Topology | None = None, *,
                 embedded: bool = False, config: Config | None = None) -> None:
        if (topology is None) != embedded:
            raise ValueError("give either a topology (a hosted swarm) or embedded=True")
        if config is not None and not embedded:
            raise ValueError("config is for embedded=True; a swarm's comes from its topology")
        self.topology = topology
        self.config = config
        self.runner: HostedSwarm | Embedded | None = None

    async def start(self) -> None:
        if self.runner is None:
            self.runner = await asyncio.to_thread(self._start)

    def _start(self) -> HostedSwarm | Embedded:
        if self.topology is None:
            return Embedded(self.config).start()
        return HostedSwarm(self.topology).start()

    async def stop(self) -> None:
        """Drain (off the event loop), then close the loop's default AsyncClient."""
        runner, self.runner = self.runner, None
        try:
            if runner is not None:
                await asyncio.to_thread(runner.stop)
        finally:
            await close_default()
            await close_limiter_pools()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Running workers for as long as the block (the app) runs."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with this object answering its lifespan messages."""
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                await self._serve_lifespan(receive, send)
            else:
                await app(scope, receive, send)

        return wrapped

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:  # noqa: BLE001 - the server reports it and exits
                    await send({"type": "lifespan.startup.failed",
                                "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.stop()
                except Exception as exc:  # noqa: BLE001 - the server reports it
                    await send({"type": "lifespan.shutdown.failed",
                                "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return


Lifespan = Callable[[Any], contextlib.AbstractAsyncContextManager[None]]


def lifespan(topology: str | Path | Topology | None = None, *, embedded: bool = False,
             config: Config | None = None) -> Lifespan:
    """``Starlette(lifespan=lifespan("swarm.toml"))``,
    ``FastAPI(lifespan=lifespan(embedded=True))``."""
    return Workers(topology, embedded=embedded, config=config).lifespan


def with_workers(app: ASGIApp, topology: str | Path | Topology | None = None, *,
                 embedded: bool = False, config: Config | None = None) -> ASGIApp:
    """A bare ASGI ``app`` whose lifespan starts and drains workers."""
    return Workers(topology, embedded=embedded, config=config).wrap(app)


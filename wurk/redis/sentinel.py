"""Redis Sentinel: where the sentinels run and which master to follow.

Duties:
1. Read the sentinel addresses, master name and password from the settings.
2. Build a connection pool template whose connections ask the sentinels for
   the master on every dial, so a reconnect after a failover reaches the
   promoted replica (for redis-py's sync and asyncio connections both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio.sentinel as asentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

if TYPE_CHECKING:
    from wurk.settings.config import Config


@dataclass(frozen=True)
class SentinelSettings:
    """Where Sentinel runs and which master to follow; the URL still gives db and auth."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Config) -> SentinelSettings | None:
        if not config.sentinels:
            return None
        pairs = []
        for address in config.sentinels:
            host, _, port = address.rpartition(":")
            pairs.append((host, int(port)))
        return cls(tuple(pairs), str(config.sentinel_master), config.sentinel_password)

    def pool_template(self, kwargs: dict[str, Any],
                      connect_timeout: float) -> redis.ConnectionPool:
        """A pool whose connections ask the sentinels for the master on every dial,
        so a reconnect after a failover reaches the promoted replica."""
        own = {k: v for k, v in kwargs.items() if k not in ("host", "port", "connection_class")}
        manager = Sentinel(list(self.sentinels), sentinel_kwargs={  # type: ignore[no-untyped-call]
            "socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout,
            "password": self.password, "retry": Retry(NoBackoff(), 0)})
        return SentinelConnectionPool(self.master, manager, **own)  # type: ignore[no-untyped-call]

    def async_pool_template(self, kwargs: dict[str, Any],
                            connect_timeout: float) -> Any:
        """The same for ``redis.asyncio``: its Sentinel pool asks for the master on every dial."""
        own = {k: v for k, v in kwargs.items() if k not in ("host", "port", "connection_class")}
        manager = asentinel.Sentinel(list(self.sentinels), sentinel_kwargs={  # type: ignore[no-untyped-call]
            "socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout,
            "password": self.password, "retry": AsyncRetry(NoBackoff(), 0)})
        return asentinel.SentinelConnectionPool(self.master, manager, **own)  # type: ignore[no-untyped-call]

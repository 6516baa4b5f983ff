"""How a pool's connections dial: the URL read by redis-py, or Redis Sentinel
asked where the master is.

Duties:
1. Read the sentinel addresses, master name and password from the settings.
2. Build the connection template a pool dials from (:func:`connection_template`),
   for redis-py's sync or asyncio connections (a :class:`Flavor`): the URL's
   auth, db, TLS and unix socket, with redis-py's own retries off and RESP2;
   with Sentinel, connections that ask the sentinels for the master on every
   dial, so a reconnect after a failover reaches the promoted replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
import redis.asyncio as aredis
import redis.asyncio.retry as aretry
import redis.asyncio.sentinel as asentinel
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff

if TYPE_CHECKING:
    from wurk.settings.config import Config


class Flavor(NamedTuple):
    """redis-py's classes for one kind of I/O: sync sockets or asyncio."""

    pool: Any
    retry: Any
    sentinel: Any
    sentinel_pool: Any


SYNC = Flavor(redis.ConnectionPool, redis.retry.Retry, redis.sentinel.Sentinel,
              redis.sentinel.SentinelConnectionPool)
ASYNC = Flavor(aredis.ConnectionPool, aretry.Retry, asentinel.Sentinel,
               asentinel.SentinelConnectionPool)


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

    def template(self, kwargs: dict[str, Any], connect_timeout: float, flavor: Flavor) -> Any:
        """A pool whose connections ask the sentinels for the master on every dial."""
        own = {k: v for k, v in kwargs.items() if k not in ("host", "port", "connection_class")}
        manager = flavor.sentinel(list(self.sentinels), sentinel_kwargs={
            "socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout,
            "password": self.password, "retry": flavor.retry(NoBackoff(), 0)})
        return flavor.sentinel_pool(self.master, manager, **own)


def connection_template(url: str, flavor: Flavor, *, connect_timeout: float, read_timeout: float,
                        sentinel: SentinelSettings | None) -> Any:
    """The redis-py pool a wurk pool takes its connection class and kwargs from
    (it owns the pooling itself)."""
    template = flavor.pool.from_url(
        url, socket_connect_timeout=connect_timeout, socket_timeout=read_timeout,
        retry=flavor.retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
        # RESP2, as Sidekiq speaks: reply shapes must not change with the redis-py version.
        protocol=2,
    )
    if sentinel is None:
        return template
    return sentinel.template(template.connection_kwargs, connect_timeout, flavor)

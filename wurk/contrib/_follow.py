"""The process's default Config, followed when it is replaced.

A module that ``wurk run -r`` or ``wurk-swarm`` loads is imported once; a
swarm imports it in the parent, then each child installs its slot's Config
as the default. An integration called without a Config applies itself to
the default now and to each Config that becomes the default later.

Duties:
1. ``each_default(apply)``: call ``apply`` on the default Config now and on
   every later one, for the life of the process.
"""

from __future__ import annotations

from collections.abc import Callable

from wurk.settings.config import Config, default_config, when_default_replaced


def each_default(apply: Callable[[Config], object]) -> Config:
    """``apply(default)`` now and whenever the default changes; returns today's default."""
    config = default_config()
    apply(config)

    def replaced(_old: Config) -> None:
        # configure() installs the new default before it calls us back with the old one.
        apply(default_config())

    when_default_replaced(replaced)
    return config

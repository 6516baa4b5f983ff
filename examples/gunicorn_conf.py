"""gunicorn config that runs a wurk swarm beside the web workers.

``gunicorn -c examples/gunicorn_conf.py myapp:app``

The swarm starts in gunicorn's master once it is ready (so web workers that
gunicorn forks never inherit swarm children) and drains when the master
exits. gunicorn keeps its own signals: TERM to the master stops both.
"""

from __future__ import annotations

import os
from typing import Any

from supervisor.hosting import HostedSwarm

bind = "127.0.0.1:8000"
workers = 2

_swarm: HostedSwarm | None = None


def when_ready(server: Any) -> None:
    global _swarm  # noqa: PLW0603 - one swarm per gunicorn master
    _swarm = HostedSwarm(os.environ.get("WURK_TOPOLOGY", "examples/topology.toml")).start()


def on_exit(server: Any) -> None:
    if _swarm is not None:
        _swarm.stop()

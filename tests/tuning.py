"""Changed copies of a frozen Config, for tests that need other settings.

``tuned(config, concurrency=1)`` is ``dataclasses.replace`` plus installing
the copy as the process default, so what reads the default (``launch()``,
``Client()``, ``@wurk.job`` helpers) sees the same settings as the test.
The default it replaces has its pool closed by ``wurk.configure``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import wurk
from wurk.settings.config import Config


def tuned(config: Config, **changes: Any) -> Config:
    """A copy of ``config`` with ``changes``, installed as the default."""
    changed = dataclasses.replace(config, **changes)
    wurk.configure(changed)
    wurk.Client._default = None
    return changed

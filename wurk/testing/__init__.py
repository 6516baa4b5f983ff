"""Testing mode: run code that pushes jobs, and the jobs themselves, without Redis.

``wurk.testing.fake()`` collects every push in memory (``fake.jobs``) and
runs them on ``fake.drain()``; ``wurk.testing.inline()`` runs each push at
once on the pushing thread. Both take the real push pipeline (the same
checks, the client middleware) and run jobs through the real job lifecycle
(the server middleware, the retry handler); only Redis is replaced by
memory. ``docs/how-to/testing.md`` shows both, with the pytest fixtures
``wurk_fake`` and ``wurk_inline`` (:mod:`wurk.testing.pytest_plugin`).

The names load on first use: the pytest plugin, which every test run of a
project with wurk installed loads, imports this package and nothing of the
worker runtime until a test asks for a mode.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wurk.testing.box import FakeJob
    from wurk.testing.client import NoRedisError
    from wurk.testing.mode import Fake, Inline, NoModeError, current, fake, inline

__all__ = ["Fake", "FakeJob", "Inline", "NoModeError", "NoRedisError", "current", "fake",
           "inline"]
_HOMES = {"FakeJob": "box", "NoRedisError": "client"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'wurk.testing' has no attribute {name!r}")
    module = importlib.import_module(f"wurk.testing.{_HOMES.get(name, 'mode')}")
    return getattr(module, name)

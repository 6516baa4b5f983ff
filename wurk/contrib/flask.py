"""Flask integration: ``Wurk(app)``, or ``ext = Wurk()`` then ``ext.init_app(app)`` in a factory.

Duties:
1. Read the app's settings: ``app.config["WURK"]`` (a dict of wurk settings)
   and ``app.config["WURK_<NAME>"]`` keys over it, all over the environment
   (``REDIS_URL``, ``WURK_*``); every value checked with wurk's own messages,
   naming ``app.config`` as the source of a bad one.
2. Install that config as the process's default (``default=False`` to keep
   another), so ``job.perform_async(...)`` in a view pushes with it; keep it
   and a :class:`wurk.Client` on it (made on first use, anew after a fork)
   in ``app.extensions["wurk"]``.
3. :attr:`Wurk.config` and :attr:`Wurk.client`: the current app's.
4. :meth:`Wurk.start_embedded`: worker threads inside this process (no
   fork), for a small app or a server's post-fork hook; stopped at exit.
   It needs no application context: in an app factory it is called right
   after ``init_app``, where there is none, and takes that app's config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

try:
    from flask import Flask, current_app, has_app_context
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("wurk.contrib.flask needs Flask: pip install 'wurk[flask]'") from exc

from wurk.core.redaction import shown
from wurk.push.client import Client
from wurk.runtime.embedded import Embedded
from wurk.settings.config import Config, ConfigError, configure, settable_fields
from wurk.settings.values import environment_layer

SOURCE = "app.config"
PREFIX = "WURK_"


@dataclass
class State:
    """What one app holds in ``app.extensions["wurk"]``."""

    config: Config
    _client: Client | None = None
    _pid: int = 0

    @property
    def client(self) -> Client:
        """Made on first use, and again in a forked child (a prefork server's
        worker): never a client of the parent's."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = Client(self.config), os.getpid()
        return self._client


class Wurk:
    def __init__(self, app: Flask | None = None, *, default: bool = True) -> None:
        self.default = default
        self._latest: Flask | None = None  # the app start_embedded() means outside a context
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        config = config_from(app.config)
        if self.default:
            config = configure(config)
        app.extensions["wurk"] = State(config)
        self._latest = app

    @property
    def config(self) -> Config:
        return _state().config

    @property
    def client(self) -> Client:
        return _state().client

    def start_embedded(self, app: Flask | None = None) -> Embedded:
        """Worker threads in this process, on ``app``'s config: by default the
        current app's, or outside an app context the app last initialised."""
        if app is None and not has_app_context():
            app = self._latest
        if app is None:
            return Embedded(self.config).start()  # the current app's, or a clear error
        with app.app_context():
            return Embedded(_state().config).start()


def config_from(app_config: dict[str, Any]) -> Config:
    """Environment < ``WURK`` dict < ``WURK_<NAME>`` keys."""
    values, sources = environment_layer(os.environ)
    table = app_config.get("WURK", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{SOURCE}: WURK must be a dict of wurk settings, "
                          f"got {shown('WURK', table, unknown=True)}")
    values.update(table)
    sources.update(dict.fromkeys(table, f"{SOURCE}['WURK']"))
    known = settable_fields()
    for key, value in app_config.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):].lower()
        if name not in known:
            raise ConfigError(f"{SOURCE}: unknown key {key!r} (wurk has no setting {name!r})")
        values[name] = value
        sources[name] = f"{SOURCE}[{key!r}]"
    return Config.from_mapping(values, source=SOURCE, sources=sources)


def _state() -> State:
    state = current_app.extensions.get("wurk")
    if not isinstance(state, State):
        raise RuntimeError("this Flask app has no wurk: call Wurk(app) or init_app(app) first")
    return state

"""Mount the wurk dashboard inside a Flask (or any WSGI) application.

    flask --app examples.web.flask_host run

werkzeug's DispatcherMiddleware sends /admin/wurk/... to the dashboard,
with SCRIPT_NAME set, so its links carry the prefix. Those requests never
reach Flask (nor its TRUSTED_HOSTS): the dashboard checks the Host itself,
against the names given to it and the loopback names.
"""

from __future__ import annotations

from typing import Any

from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import wurk.web

ALLOWED_HOSTS = ["www.example.com"]


def make_app(config: wurk.Config | None = None) -> Flask:
    flask_app = Flask(__name__)

    @flask_app.get("/")
    def home() -> str:
        return "my app"

    dispatcher: Any = DispatcherMiddleware(flask_app.wsgi_app, {
        "/admin/wurk": wurk.web.wsgi_app(config, allowed_hosts=ALLOWED_HOSTS),
    })
    flask_app.wsgi_app = dispatcher  # type: ignore[method-assign]
    return flask_app


app = make_app()

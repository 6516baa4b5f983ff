"""A Flask app factory with wurk: ``flask --app examples.flask_app run``.

Settings come from ``app.config["WURK"]`` and ``WURK_<NAME>`` keys (here the
Redis URL from ``REDIS_URL``); jobs are pushed from the views as anywhere
else. Workers run apart (``wurk-swarm -t examples/topology.toml``), or in
this process with ``WURK_EMBEDDED=1`` (threads, for a small app).
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify

from examples.jobs import ChargeCard, send_welcome_email
from wurk.contrib.flask import Wurk

wurk_ext = Wurk()


def create_app(settings: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["WURK"] = {"redis_url": os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
                          "queues": ["critical", "default"]}
    app.config.update(settings or {})
    wurk_ext.init_app(app)

    @app.post("/signup/<int:user_id>")
    def signup(user_id: int) -> Any:
        # The push goes through the process's default config, which init_app set.
        jid = send_welcome_email.perform_async(user_id, f"user{user_id}@example.com")
        return jsonify(enqueued=jid)

    @app.post("/orders/<order_id>/charge")
    def charge(order_id: str) -> Any:
        # Or explicitly through this app's own client.
        jid = ChargeCard.set(client=wurk_ext.client).perform_async(order_id, 1999)
        return jsonify(enqueued=jid)

    if os.environ.get("WURK_EMBEDDED") == "1":
        wurk_ext.start_embedded()
    return app

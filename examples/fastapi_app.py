"""A FastAPI app with wurk: ``uvicorn examples.fastapi_app:app``.

The workers live as long as the app (``wurk.contrib.asgi.lifespan``): a
hosted swarm from ``WURK_TOPOLOGY`` (forked children), or with
``WURK_MODE=embedded`` threads in this process. Sync handlers push as
anywhere else (FastAPI runs them in its thread pool); async handlers await
the ``aperform_*`` verbs, which push through the loop's ``wurk.AsyncClient``,
so the event loop never waits on Redis; the lifespan closes that client.
"""

from __future__ import annotations

import os

from fastapi import FastAPI

from examples.jobs import ChargeCard, send_welcome_email
from wurk.contrib.asgi import lifespan

if os.environ.get("WURK_MODE") == "embedded":
    workers = lifespan(embedded=True)
else:
    workers = lifespan(os.environ.get("WURK_TOPOLOGY", "examples/topology.toml"))

app = FastAPI(lifespan=workers)


@app.post("/signup/{user_id}")
async def signup(user_id: int) -> dict[str, str | None]:
    jid = await send_welcome_email.aperform_async(user_id, f"user{user_id}@example.com")
    return {"enqueued": jid}


@app.post("/orders/{order_id}/charge")
def charge(order_id: str) -> dict[str, str | None]:
    return {"enqueued": ChargeCard.perform_async(order_id, 1999)}

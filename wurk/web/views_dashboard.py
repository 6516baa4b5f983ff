"""The Dashboard page and the JSON its realtime graph polls.

Duties:
1. ``GET /``: processed and failed totals, the set sizes, enqueued and busy
   counts, the history graph's data (``?days=`` 7, 30, 90 or 180 from the
   daily stat keys, :class:`wurk.api.History`) and Redis's INFO figures.
2. ``GET /stats.json``: the counters the page's script turns into live
   rates every few seconds.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from wurk.api import History, Stats, redis_info
from wurk.web.site import Site, page

HISTORY_DAYS = (7, 30, 90, 180)


def counters(site: Site) -> dict[str, Any]:
    stats = Stats(config=site.config)
    return {"processed": stats.processed, "failed": stats.failed,
            "busy": stats.workers_size, "enqueued": stats.enqueued,
            "retries": stats.retry_size, "scheduled": stats.scheduled_size,
            "dead": stats.dead_size, "processes": stats.processes_size,
            "default_latency": round(stats.default_queue_latency, 3), "at": time.time()}


def dashboard(request: Request, site: Site) -> Response:
    try:
        days = int(request.query_params.get("days", "30"))
    except ValueError:
        days = 30
    if days not in HISTORY_DAYS:
        days = 30
    history = History(days, config=site.config)
    processed, failed = history.processed, history.failed
    series = {"dates": list(reversed(history.dates)),
              "processed": [processed[d] for d in reversed(history.dates)],
              "failed": [failed[d] for d in reversed(history.dates)]}
    info = redis_info(config=site.config)
    return site.render(request, "dashboard.html", title="Dashboard", active="dashboard",
                       stats=counters(site), history=series, days=days,
                       history_days=HISTORY_DAYS, info=info)


def stats_json(request: Request, site: Site) -> Response:
    return JSONResponse(counters(site))


ROUTES = [Route("/", page(dashboard)), Route("/stats.json", page(stats_json))]

"""The Metrics pages: per-class executions, failures and time from Sidekiq 7's keys.

Duties:
1. ``GET /metrics?hours=1|2|4|8``: every class the workers recorded in the
   window (:class:`wurk.api.class_metrics.ClassMetricsQuery`) with
   executions, failures, total and average time; and which live processes
   record nothing: a heartbeat without ``capsules`` is Ruby Sidekiq 6.x
   (Sidekiq 7+ and wurk write it; wurk with ``class_metrics`` off cannot be
   told from outside).
2. ``GET /metrics/{class}?hours=``: one class's totals, its run-time
   histogram (Sidekiq's 26 buckets) and its executions and failures per
   minute, drawn by the page's script from JSON in the page.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import ProcessSet
from wurk.api.class_metrics import HOURS, MAX_CLASS, ClassMetricsQuery
from wurk.web.site import Site, page


def hours_of(request: Request) -> int:
    try:
        hours = int(request.query_params.get("hours", "1"))
    except ValueError:
        return 1
    return hours if hours in HOURS else 1


def silent_processes(site: Site) -> list[str]:
    """Live Sidekiq 6.x processes (no ``capsules`` in their heartbeat): they record no metrics."""
    return [f"{p.hostname}:{p.pid}" for p in ProcessSet(config=site.config)
            if "capsules" not in p.info]


def metrics(request: Request, site: Site) -> Response:
    hours = hours_of(request)
    rows = ClassMetricsQuery(config=site.config).top(hours)
    return site.render(request, "metrics.html", title="Metrics", active="metrics", rows=rows,
                       hours=hours, hour_choices=HOURS, silent=silent_processes(site),
                       totals={"processed": sum(r.processed for r in rows),
                               "failed": sum(r.failed for r in rows)})


def metrics_class(request: Request, site: Site) -> Response:
    name = request.path_params["name"]
    if not name or len(name) > MAX_CLASS:
        raise HTTPException(404, "no such class")
    hours = hours_of(request)
    series = ClassMetricsQuery(config=site.config).for_class(name, hours)
    chart = {"minutes": series.minutes, "processed": series.processed,
             "failed": series.failed, "histogram": series.histogram,
             "labels": list(series.labels)}
    return site.render(request, "metrics_class.html", title=f"Metrics {name}", active="metrics",
                       name=name, series=series, totals=series.totals, hours=hours,
                       hour_choices=HOURS, chart=chart)


ROUTES = [
    Route("/metrics", page(metrics)),
    Route("/metrics/{name:str}", page(metrics_class)),
]

"""The Periodic pages: the periodic entries the leader fires, with pause and unpause.

Duties:
1. ``GET /periodic``: every entry registered in Redis (:class:`wurk.api.PeriodicSet`,
   wurk's and Sidekiq Enterprise's loops alike) with its job, queue,
   schedule, time zone, next run, last fire and paused state.
2. ``GET /periodic/{name}``: one entry's arguments and options, its next
   five runs and its recent fires (time and jid).
3. ``POST /periodic/{name}/pause|unpause``: the ``paused`` flag the leading
   process honours at its next pass (unpausing skips the ticks that fell
   while paused).
"""

from __future__ import annotations

import time
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api.periodic import PeriodicSet, UnknownPeriodicError
from wurk.web.site import Site, action, page, redirect

NEXT_RUNS = 5
MAX_NAME = 1024


def _name(request: Request) -> str:
    name: str = request.path_params["name"]
    if not name or len(name) > MAX_NAME:
        raise HTTPException(404, "no such periodic entry")
    return name


def periodic(request: Request, site: Site) -> Response:
    entries = PeriodicSet(site.config).all()
    return site.render(request, "periodic.html", title="Periodic", active="periodic",
                       entries=entries, done=request.query_params.get("done", ""))


def entry(request: Request, site: Site) -> Response:
    name = _name(request)
    periodic_set = PeriodicSet(site.config)
    try:
        info = periodic_set.fetch(name)
        upcoming = periodic_set.next_runs(name, NEXT_RUNS)
        runs = periodic_set.history(name)
    except UnknownPeriodicError:
        raise HTTPException(404, "no periodic entry of that name") from None
    return site.render(request, "periodic_entry.html", title=f"Periodic {name}",
                       active="periodic", info=info, upcoming=upcoming, runs=runs,
                       now=time.time(), done=request.query_params.get("done", ""))


def _flag(request: Request, site: Site, paused: bool) -> Response:
    name = _name(request)
    try:
        if paused:
            PeriodicSet(site.config).pause(name)
        else:
            PeriodicSet(site.config).unpause(name)
    except UnknownPeriodicError:
        raise HTTPException(404, "no periodic entry of that name") from None
    done = "periodic-paused" if paused else "periodic-unpaused"
    if request.query_params.get("from") == "entry":
        return redirect(request, f"/periodic/{quote(name, safe='')}", done=done)
    return redirect(request, "/periodic", done=done)


def pause(request: Request, site: Site, form: FormData) -> Response:
    return _flag(request, site, paused=True)


def unpause(request: Request, site: Site, form: FormData) -> Response:
    return _flag(request, site, paused=False)


ROUTES = [
    Route("/periodic", page(periodic)),
    Route("/periodic/{name:str}", page(entry)),
    Route("/periodic/{name:str}/pause", action(pause), methods=["POST"]),
    Route("/periodic/{name:str}/unpause", action(unpause), methods=["POST"]),
]

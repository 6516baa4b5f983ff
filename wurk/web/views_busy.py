"""The Busy page: live processes (Ruby Sidekiq and wurk alike) and running jobs.

Duties:
1. ``GET /busy``: each live process (:class:`wurk.api.ProcessSet`) with host,
   pid, tag, queues, threads, busy, RSS, started, last beat and its
   quiet/stopping state; then every running job (:class:`wurk.api.Workers`)
   with its process, thread, queue, class, args and run time.
2. ``POST /busy/quiet`` and ``/busy/stop`` (``identity``): the remote
   signal the process picks up on its next heartbeat; an embedded process
   refuses, and the refusal is shown as a 409 page.
"""

from __future__ import annotations

import time

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import ProcessControlError, ProcessSet, Workers
from wurk.web.site import Site, action, page, redirect


def busy(request: Request, site: Site) -> Response:
    processes = list(ProcessSet(config=site.config))
    running = list(Workers(config=site.config))
    return site.render(request, "busy.html", title="Busy", active="busy",
                       processes=processes, running=running, now=time.time(),
                       total_threads=sum(p.concurrency for p in processes),
                       total_busy=sum(p.busy for p in processes),
                       total_rss=sum(p.rss for p in processes),
                       done=request.query_params.get("done", ""))


def _signal(request: Request, site: Site, form: FormData, verb: str) -> Response:
    identity = form.get("identity")
    if not isinstance(identity, str) or not identity:
        raise HTTPException(400, "which process? the form has no identity")
    process = ProcessSet(config=site.config).get(identity)
    if process is None:
        raise HTTPException(404, "no live process with that identity")
    try:
        process.quiet() if verb == "quiet" else process.stop()
    except ProcessControlError as exc:
        raise HTTPException(409, str(exc)) from exc
    return redirect(request, "/busy", done=verb)


def quiet(request: Request, site: Site, form: FormData) -> Response:
    return _signal(request, site, form, "quiet")


def stop(request: Request, site: Site, form: FormData) -> Response:
    return _signal(request, site, form, "stop")


ROUTES = [
    Route("/busy", page(busy)),
    Route("/busy/quiet", action(quiet), methods=["POST"]),
    Route("/busy/stop", action(stop), methods=["POST"]),
]

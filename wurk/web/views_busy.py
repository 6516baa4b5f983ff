"""The Busy page: live processes (Ruby Sidekiq and wurk alike) and running jobs.

Duties:
1. ``GET /busy``: each live process (:class:`wurk.api.ProcessSet`) with host,
   pid, tag, queues, threads, busy, RSS, started, last beat and its
   quiet/stopping state; then every running job (:class:`wurk.api.Workers`)
   with its process, thread, queue, class, args and run time.
   Processes are sorted by host, then pid as a number; each shows its
   utilisation (busy of its threads), and each running job its jid.
2. ``POST /busy/quiet`` and ``/busy/stop`` (``identity``): the remote
   signal the process picks up on its next heartbeat; an embedded process
   refuses, and the refusal is shown as a 409 page. A swarm child's Stop
   says the swarm replaces it.
3. ``POST /busy/quiet-all`` and ``/busy/stop-all``: as ``wurk quiet|stop
   --all``: every live swarm (which acts on its children) and every live
   process outside a swarm; embedded processes are skipped.
4. ``POST /busy/cancel`` (``jid``): as ``wurk cancel JID``: the running job
   gets ``JobCancelled`` from its own process within about a second; a jid
   no longer running (it ended meanwhile) is a 404 page.
"""

from __future__ import annotations

import time

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import (
    JobNotFoundError,
    Process,
    ProcessControlError,
    ProcessSet,
    SwarmSet,
    Workers,
    cancel,
)
from wurk.web.site import Site, action, page, redirect


def busy(request: Request, site: Site) -> Response:
    processes = sorted(ProcessSet(config=site.config),
                       key=lambda p: (p.hostname, p.pid, p.identity))
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


def _everyone(request: Request, site: Site, verb: str) -> Response:
    """Every live swarm and every process outside one, as ``--all`` reaches them."""
    swarms = [s for s in SwarmSet(config=site.config) if not s.stale()]
    children = {c for s in swarms for c in s.children}
    outside = [p for p in ProcessSet(config=site.config)
               if p.identity not in children and not p.embedded and not _swarm_child(p)]
    for swarm in swarms:
        swarm.quiet() if verb == "quiet" else swarm.stop()
    for process in outside:
        process.quiet() if verb == "quiet" else process.stop()
    return redirect(request, "/busy", done=verb)


def _swarm_child(process: Process) -> bool:
    return process.slot is not None


def quiet_all(request: Request, site: Site, form: FormData) -> Response:
    return _everyone(request, site, "quiet")


def stop_all(request: Request, site: Site, form: FormData) -> Response:
    return _everyone(request, site, "stop")


def cancel_job(request: Request, site: Site, form: FormData) -> Response:
    jid = form.get("jid")
    if not isinstance(jid, str) or not jid:
        raise HTTPException(400, "which job? the form has no jid")
    try:
        cancel(jid, config=site.config)
    except JobNotFoundError as exc:
        raise HTTPException(404, str(exc)) from exc
    return redirect(request, "/busy", done="cancel")


ROUTES = [
    Route("/busy", page(busy)),
    Route("/busy/quiet", action(quiet), methods=["POST"]),
    Route("/busy/stop", action(stop), methods=["POST"]),
    Route("/busy/quiet-all", action(quiet_all), methods=["POST"]),
    Route("/busy/stop-all", action(stop_all), methods=["POST"]),
    Route("/busy/cancel", action(cancel_job), methods=["POST"]),
]

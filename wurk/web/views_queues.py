"""The Queues pages: every queue's size, latency and pause; one queue paged.

Duties:
1. ``GET /queues``: each known queue with size, latency and paused state,
   and pause/unpause/clear buttons (clear asks for confirmation).
2. ``GET /queues/{name}?page=N``: one page of that queue, newest first, by
   LRANGE index (:func:`wurk.api.queue_page`), so a queue of a million jobs
   is never read whole; a delete button per job.
3. ``POST /queues/{name}/pause|unpause|clear`` and ``.../delete`` (one job,
   named by the index the page showed and its jid, found again near that
   index and removed with LREM 1 of its exact bytes).
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import Queue, find_queued, queue_page
from wurk.web.site import Site, action, page, redirect

PER_PAGE = 25
MAX_QUEUE_NAME = 1024


def page_number(request: Request) -> int:
    try:
        number = int(request.query_params.get("page", "1"))
    except ValueError:
        return 1
    return min(max(number, 1), 10**9)


def queue_named(request: Request, site: Site) -> Queue:
    name = request.path_params["name"]
    if not name or len(name) > MAX_QUEUE_NAME or not _one_segment(request):
        raise HTTPException(404, "no such queue")
    return Queue(name, config=site.config)


def _one_segment(request: Request) -> bool:
    """Whether the name came as one path segment: a ``/`` in a name arrives as
    ``%2F``; a bare ``/`` separates segments (``GET /queues/default/pause`` is
    no queue named ``default/pause``)."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):
        return "/" not in request.path_params["name"]
    rest = raw.decode("latin-1").partition("?")[0].rpartition("/queues/")[2]
    action = request.url.path.rpartition("/")[2] if request.method == "POST" else ""
    return "/" not in (rest.removesuffix(f"/{action}") if action else rest)


def queues(request: Request, site: Site) -> Response:
    rows = [{"name": q.name, "size": q.size, "latency": q.latency, "paused": q.paused}
            for q in Queue.all(config=site.config)]
    return site.render(request, "queues.html", title="Queues", active="queues", queues=rows,
                       done=request.query_params.get("done", ""))


def queue(request: Request, site: Site) -> Response:
    q = queue_named(request, site)
    listing = queue_page(q, page_number(request), PER_PAGE)
    if listing.number > listing.pages:  # past the end (a bookmark, a queue that shrank)
        listing = queue_page(q, listing.pages, PER_PAGE)
    return site.render(request, "queue.html", title=f"Queue {q.name}", active="queues",
                       queue=q, paused=q.paused, listing=listing,
                       done=request.query_params.get("done", ""))


def pause(request: Request, site: Site, form: FormData) -> Response:
    queue_named(request, site).pause()
    return redirect(request, "/queues", done="paused")


def unpause(request: Request, site: Site, form: FormData) -> Response:
    queue_named(request, site).unpause()
    return redirect(request, "/queues", done="unpaused")


def clear(request: Request, site: Site, form: FormData) -> Response:
    q = queue_named(request, site)
    if form.get("confirm") != q.name:
        raise HTTPException(400, "clearing a queue needs confirm=<the queue's name>")
    q.clear()
    return redirect(request, "/queues", done="cleared")


def delete_job(request: Request, site: Site, form: FormData) -> Response:
    q = queue_named(request, site)
    try:
        index = int(str(form.get("index", "")))
    except ValueError:
        raise HTTPException(400, "which job? the form needs its index and jid") from None
    found = find_queued(q, index, str(form.get("jid", "")))
    removed = found is not None and found.delete()
    return redirect(request, f"/queues/{quote(q.name, safe='')}", page=page_number_of(form),
                    done="deleted" if removed else "gone")


def page_number_of(form: FormData) -> int:
    try:
        return max(1, int(str(form.get("page", "1"))))
    except ValueError:
        return 1


# ``path``: a queue's name may hold a ``/`` (sent encoded, decoded before routing).
ROUTES = [
    Route("/queues", page(queues)),
    Route("/queues/{name:path}/pause", action(pause), methods=["POST"]),
    Route("/queues/{name:path}/unpause", action(unpause), methods=["POST"]),
    Route("/queues/{name:path}/clear", action(clear), methods=["POST"]),
    Route("/queues/{name:path}/delete", action(delete_job), methods=["POST"]),
    Route("/queues/{name:path}", page(queue)),
]

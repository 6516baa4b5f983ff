"""The Retries, Scheduled and Dead pages: paged, sorted, searched, acted on.

Duties:
1. ``GET /{set}``: one page by ZRANGE index (:func:`wurk.api.set_page`),
   earliest or latest first (``?sort=asc|desc``), or with ``?q=`` the
   entries whose payload contains the text (class, jid, an argument), by
   ZSCAN MATCH (:func:`wurk.api.search_set`, at most 1,000 matches), paged
   the same way, so 10,000 dead jobs are never read or rendered whole.
2. ``GET /{set}/{key}``: one entry (``score-jid``) with its args, error,
   backtrace and every payload field.
3. ``POST /{set}/{key}``, ``POST /{set}`` (the ticked ``key`` fields) and
   ``POST /{set}/all``: ``retry`` (retries and dead), ``add`` (push now),
   ``delete``, ``kill`` (retries and scheduled), each through
   :class:`wurk.api.SortedEntry`, so a race with a worker or another
   operator never pushes a job twice; "delete all" and "kill all" go a
   chunk of entries per script (``clear``, ``kill_all``), each job's lock,
   batch count and result waiters released with it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import DeadSet, RetrySet, ScheduledSet, SortedEntry, SortedSet
from wurk.api.paging import Page, entry_key, find_entry, search_set, set_page
from wurk.web.site import Site, action, page, redirect
from wurk.web.views_queues import page_number
from wurk.wire.payload import PayloadError

PER_PAGE = 25
MAX_QUERY = 200
MAX_SELECTED = 1000


@dataclass(frozen=True)
class SetKind:
    slug: str
    title: str
    cls: type[SortedSet]
    actions: tuple[str, ...]
    descending: bool  # the default order
    when: str  # what the score means, as a column heading


KINDS = {
    "retries": SetKind("retries", "Retries", RetrySet, ("retry", "add", "delete", "kill"),
                       False, "Next retry"),
    "scheduled": SetKind("scheduled", "Scheduled", ScheduledSet, ("add", "delete", "kill"),
                         False, "When"),
    "dead": SetKind("dead", "Dead", DeadSet, ("retry", "add", "delete"), True, "Last retry"),
}
LABELS = {"retry": "Retry now", "add": "Add to queue", "delete": "Delete", "kill": "Kill"}


def listing(kind: SetKind, request: Request, site: Site) -> Response:
    sset = kind.cls(config=site.config)
    sort = request.query_params.get("sort", "desc" if kind.descending else "asc")
    descending = sort == "desc"
    query = request.query_params.get("q", "").strip()[:MAX_QUERY]
    context: dict[str, Any] = {"query": query, "sort": "desc" if descending else "asc"}
    if query:
        found, truncated = search_set(sset, query, descending=descending)
        number = min(page_number(request), max(1, -(-len(found) // PER_PAGE)))
        start = (number - 1) * PER_PAGE
        result = Page(found[start:start + PER_PAGE], len(found), number, PER_PAGE)
        context.update(entries=result.items, total=len(found), truncated=truncated,
                       listing=result)
    else:
        result = set_page(sset, page_number(request), PER_PAGE, descending=descending)
        if result.number > result.pages:  # past the end (a bookmark, a set that shrank)
            result = set_page(sset, result.pages, PER_PAGE, descending=descending)
        context.update(entries=result.items, total=result.total, truncated=False,
                       listing=result)
    return site.render(request, "set.html", title=kind.title, active=kind.slug, kind=kind,
                       labels=LABELS, key_of=entry_key, done=request.query_params.get("done", ""),
                       count=request.query_params.get("n", ""),
                       refused=request.query_params.get("refused", ""), **context)


def entry(kind: SetKind, request: Request, site: Site) -> Response:
    found = find_entry(kind.cls(config=site.config), request.path_params["key"])
    if found is None:
        raise HTTPException(404, "this job is no longer in the set (retried, deleted or "
                                 "moved by someone else)")
    return site.render(request, "entry.html", title=f"{kind.title}: {found.klass}",
                       active=kind.slug, kind=kind, entry=found, labels=LABELS,
                       key=entry_key(found))


def apply(kind: SetKind, verb: str, entries: Iterable[SortedEntry]) -> tuple[int, int]:
    """Do ``verb`` to each entry: how many this request did (others may race
    it), and how many it could not (a payload that is no job stays put)."""
    if verb not in kind.actions:
        raise HTTPException(400, f"{kind.title} has no action {verb!r}")
    done = refused = 0
    for item in entries:
        try:
            done += _one(verb, item)
        except PayloadError:
            refused += 1
    return done, refused


def _one(verb: str, item: SortedEntry) -> bool:
    if verb == "retry":
        return item.retry()
    if verb == "add":
        return item.add_to_queue()
    if verb == "delete":
        return item.delete()
    return item.kill()


def _after(request: Request, kind: SetKind, verb: str, result: tuple[int, int]) -> Response:
    done, refused = result
    return redirect(request, f"/{kind.slug}", done=verb, n=done,
                    **({"refused": refused} if refused else {}))


def act_on_one(kind: SetKind, request: Request, site: Site, form: FormData) -> Response:
    found = find_entry(kind.cls(config=site.config), request.path_params["key"])
    verb = str(form.get("action", ""))
    return _after(request, kind, verb, apply(kind, verb, [found] if found else []))


def act_on_selected(kind: SetKind, request: Request, site: Site, form: FormData) -> Response:
    sset = kind.cls(config=site.config)
    keys = [str(k) for k in form.getlist("key")][:MAX_SELECTED]
    chosen = [e for e in (find_entry(sset, key) for key in keys) if e is not None]
    verb = str(form.get("action", ""))
    return _after(request, kind, verb, apply(kind, verb, chosen))


def act_on_all(kind: SetKind, request: Request, site: Site, form: FormData) -> Response:
    sset = kind.cls(config=site.config)
    verb = str(form.get("action", ""))
    if form.get("confirm") != "all":
        raise HTTPException(400, "acting on every entry needs confirm=all")
    if verb == "delete":  # chunked, each job's lock, batch and waiters released
        return redirect(request, f"/{kind.slug}", done=verb, n=sset.clear())
    if verb == "kill" and isinstance(sset, RetrySet | ScheduledSet):
        return redirect(request, f"/{kind.slug}", done=verb, n=sset.kill_all())
    # entries() walks by score and survives the moves it makes.
    return _after(request, kind, verb, apply(kind, verb, sset.entries()))


def _routes(kind: SetKind) -> list[Route]:
    bind = functools.partial
    return [
        Route(f"/{kind.slug}", page(bind(listing, kind))),
        Route(f"/{kind.slug}", action(bind(act_on_selected, kind)), methods=["POST"]),
        Route(f"/{kind.slug}/all", action(bind(act_on_all, kind)), methods=["POST"]),
        Route(f"/{kind.slug}/{{key:str}}", page(bind(entry, kind))),
        Route(f"/{kind.slug}/{{key:str}}", action(bind(act_on_one, kind)), methods=["POST"]),
    ]


ROUTES = [route for kind in KINDS.values() for route in _routes(kind)]

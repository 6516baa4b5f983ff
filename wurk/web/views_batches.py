"""The Batches and Workflows pages: what a set of jobs is waiting on, and why it failed.

Duties:
1. ``GET /batches?page=N``: the ``batches`` index newest first, a page at a
   time, each batch read through :class:`wurk.api.BatchSet` (the same reads
   as ``wurk batches``): state, done/total, pending, failures, callbacks
   fired, created, time left, description. An index entry whose record
   expired shows "expired", one that cannot be read shows "unreadable".
2. ``GET /batches/{bid}``: one batch: counts, failures with jids and errors,
   dead jids, the first 100 pending jids (each a search of the retries, where
   a pending job that failed waits), parent and children (linked), callbacks and when each fired,
   the problems found reading it, and a link to its workflow when it is one.
3. ``GET /workflows?page=N``: the ``wurk:workflows`` index newest first
   (:func:`wurk.workflows.status.summaries`) with state, policy,
   description and times.
4. ``GET /workflows/{wid}``: one workflow (:func:`wurk.workflows.status.read`,
   as ``wurk workflows show``): each step with its job, job count, state,
   batch (linked) and error, and the stored results of its last steps.
Everything shown comes from Redis and is escaped; a record of the wrong
type or with garbage fields renders as "unreadable", never as a 500.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.exceptions as rx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api.paging import Page
from wurk.batches import keys as batch_keys
from wurk.batches.api import BatchSet, BatchStatus
from wurk.push.client import Client
from wurk.web.site import Site, page
from wurk.web.views_queues import page_number
from wurk.workflows.spec import WorkflowError
from wurk.workflows.status import count, read, summaries

PER_PAGE = 25
MAX_WID = 64
# What a read of untrusted Redis data may raise; the page says "unreadable" instead.
UNREADABLE = (ValueError, TypeError, KeyError, OverflowError, rx.ResponseError)


def _unreadable(bid: str, exc: Exception) -> BatchStatus:
    return BatchStatus(bid, exists=True, state="unreadable",
                       problems=[f"{type(exc).__name__}: {exc}"[:300]])


def _status(batches: BatchSet, bid: str) -> BatchStatus:
    try:
        status = batches.get(bid)
    except UNREADABLE as exc:
        return _unreadable(bid, exc)
    if not status.exists and status.problems:  # b-<bid> is there, of the wrong type
        return BatchStatus(bid, exists=True, state="unreadable", problems=status.problems)
    return status


def _page_of(request: Request, total: int) -> int:
    return min(page_number(request), max(1, -(-total // PER_PAGE)))


def batches(request: Request, site: Site) -> Response:
    found = BatchSet(config=site.config)
    total = found.size()
    number = _page_of(request, total)
    rows = [_status(found, bid) for bid in found.bids(PER_PAGE, (number - 1) * PER_PAGE)]
    return site.render(request, "batches.html", title="Batches", active="batches",
                       listing=Page(rows, total, number, PER_PAGE), rows=rows,
                       now=time.time(), events=batch_keys.EVENTS)


def _json_text(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, default=str, sort_keys=True)


def _callbacks(status: BatchStatus) -> tuple[dict[str, str], str]:
    """Each event's callbacks as compact JSON, and what is left (garbage) as text."""
    stored: Any = status.callbacks  # any JSON: the record is untrusted
    if not isinstance(stored, dict):
        return {}, _json_text(stored, None)
    per_event = {event: _json_text(stored[event], None) for event in batch_keys.EVENTS
                 if event in stored}
    rest = {k: v for k, v in stored.items() if k not in per_event}
    return per_event, _json_text(rest, None) if rest else ""


def batch(request: Request, site: Site) -> Response:
    bid = request.path_params["bid"]
    if not batch_keys.valid_bid(bid):
        raise HTTPException(404, "no such batch")
    status = _status(BatchSet(config=site.config), bid)
    if not status.exists:
        raise HTTPException(404, "no batch of that id (never made, or expired)")
    per_event, other = _callbacks(status)
    return site.render(request, "batch.html", title=f"Batch {bid}", active="batches",
                       b=status, now=time.time(), events=batch_keys.EVENTS,
                       callbacks=per_event, other_callbacks=other,
                       is_workflow=isinstance(status.workflow, dict)
                       and "steps" in status.workflow)


def workflows(request: Request, site: Site) -> Response:
    client = Client(site.config, drain_spool=False)
    total = count(client)
    number = _page_of(request, total)
    rows = summaries(client, PER_PAGE, (number - 1) * PER_PAGE)
    return site.render(request, "workflows.html", title="Workflows", active="workflows",
                       listing=Page(rows, total, number, PER_PAGE), rows=rows)


def workflow(request: Request, site: Site) -> Response:
    wid = request.path_params["wid"]
    if not wid or len(wid) > MAX_WID:
        raise HTTPException(404, "no such workflow")
    try:
        status = read(Client(site.config, drain_spool=False), wid)
    except WorkflowError as exc:
        raise HTTPException(404, str(exc)[:300]) from None
    except UNREADABLE as exc:
        raise HTTPException(409, f"workflow {wid!r:.80} is unreadable: "
                                 f"{type(exc).__name__}: {exc}"[:300]) from None
    results = [(name, _json_text(value)) for name, value in status.results.items()]
    return site.render(request, "workflow.html", title=f"Workflow {wid}", active="workflows",
                       w=status, steps=list(status.steps.values()), results=results)


ROUTES = [
    Route("/batches", page(batches)),
    Route("/batches/{bid:str}", page(batch)),
    Route("/workflows", page(workflows)),
    Route("/workflows/{wid:str}", page(workflow)),
]

"""The Limiters and Unique pages: who holds what, and the operator's way out.

Duties:
1. ``GET /limiters``: every registered limiter (:class:`wurk.api.LimiterSet`,
   wurk's and Sidekiq Enterprise's) with kind, limit, what is in use now
   and its options; one that cannot be read shows why.
2. ``POST /limiters/{name}/reset`` (``confirm=<name>``, asked for first):
   delete the limiter's holders and counts, keep it registered; one whose
   description cannot be read is refused (409), never guessed at.
3. ``GET /unique``: the unique-job locks (:class:`wurk.api.UniqueLocks`, a
   bounded SCAN of ``unique:*``, at most :data:`LOCKS` shown) with holder
   jid and time left, and the holding job's class, arguments and place
   where a bounded look finds it (:mod:`wurk.api.unique_holders`).
4. ``POST /unique/release`` (``key``, asked for first): drop one lock,
   whoever holds it, so a duplicate may be pushed now.
"""

from __future__ import annotations

import json

import redis.exceptions as rx
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api.limiters import LimiterSet, UnknownLimiterError
from wurk.api.unique_holders import holders
from wurk.limiter.policy import LimiterArgumentError
from wurk.unique.api import UniqueLocks
from wurk.web.site import Site, action, page, redirect

LOCKS = 200
MAX_NAME = 1024


def limiters(request: Request, site: Site) -> Response:
    rows = [(info, json.dumps(info.options, sort_keys=True, default=str))
            for info in LimiterSet(config=site.config)]
    return site.render(request, "limiters.html", title="Limiters", active="limiters",
                       rows=rows, done=request.query_params.get("done", ""))


def reset_limiter(request: Request, site: Site, form: FormData) -> Response:
    name = request.path_params["name"]
    if not name or len(name) > MAX_NAME:
        raise HTTPException(404, "no such limiter")
    if form.get("confirm") != name:
        raise HTTPException(400, "resetting a limiter needs confirm=<the limiter's name>")
    try:
        LimiterSet(config=site.config).reset(name)
    except UnknownLimiterError:
        raise HTTPException(404, "no limiter of that name is registered") from None
    except (rx.ResponseError, LimiterArgumentError, KeyError, TypeError, ValueError) as exc:
        # Its meta hash is garbage: which keys are its state cannot be known.
        raise HTTPException(409, f"limiter {name!r:.80} cannot be read, so not reset: "
                                 f"{type(exc).__name__}: {exc}"[:300]) from None
    return redirect(request, "/limiters", done="limiter-reset")


def unique(request: Request, site: Site) -> Response:
    locks = UniqueLocks(config=site.config).locks(limit=LOCKS)
    held = holders((lock.holder for lock in locks), config=site.config)
    return site.render(request, "unique.html", title="Unique locks", active="unique",
                       locks=locks, holders=held, limit=LOCKS,
                       done=request.query_params.get("done", ""))


def release(request: Request, site: Site, form: FormData) -> Response:
    key = form.get("key")
    if not isinstance(key, str):
        raise HTTPException(400, "which lock? the form needs its key")
    try:
        released = UniqueLocks(config=site.config).release_key(key)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return redirect(request, "/unique", done="unique-released" if released else "unique-gone")


ROUTES = [
    Route("/limiters", page(limiters)),
    Route("/limiters/{name:str}/reset", action(reset_limiter), methods=["POST"]),
    Route("/unique", page(unique)),
    Route("/unique/release", action(release), methods=["POST"]),
]

"""The Profiles pages: stored job profiles and their top functions.

Duties:
1. ``GET /profiles``: the newest 100 profiles (:class:`wurk.api.profiles.ProfileSet`,
   which prunes expired ones first) with token, type, jid, started,
   elapsed, size and expiry.
2. ``GET /profiles/{key}?sort=cumulative|tottime|calls``: one cProfile
   profile's 40 heaviest functions, read through the checked decoder (a
   crafted value is refused, never unmarshalled); another type (Sidekiq's
   Vernier JSON) is offered for download only.
3. ``GET /profiles/{key}/download``: the data as a file (``.prof`` for
   cProfile: ``python -m pstats FILE`` or snakeviz open it), under a name
   that cannot carry a path.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api.profiles import SORTS, ProfileNotFoundError, ProfileRecord, ProfileSet
from wurk.web.site import Site, page
from wurk.wire.profile_data import ProfileDataError, safe_file_name

LIST_LIMIT = 100
TOP = 40


def _record(site: Site, key: str) -> ProfileRecord:
    try:
        return ProfileSet(config=site.config).fetch(key)
    except ProfileNotFoundError:
        raise HTTPException(404, "this profile is gone (expired or never stored)") from None


def profiles(request: Request, site: Site) -> Response:
    records = ProfileSet(config=site.config).entries(limit=LIST_LIMIT)
    return site.render(request, "profiles.html", title="Profiles", active="profiles",
                       records=records, limit=LIST_LIMIT)


def profile(request: Request, site: Site) -> Response:
    key = request.path_params["key"]
    record = _record(site, key)
    sort = request.query_params.get("sort", "cumulative")
    if sort not in SORTS:
        sort = "cumulative"
    rows, problem = [], ""
    if record.type == "cprofile":
        try:
            rows = ProfileSet(config=site.config).top(key, sort=sort, limit=TOP)
        except ProfileNotFoundError:
            raise HTTPException(404, "this profile is gone (expired meanwhile)") from None
        except ProfileDataError as exc:
            problem = str(exc)
    else:
        problem = (f"A {record.type or 'typeless'} profile (Sidekiq's Vernier profiles are "
                   "gzip JSON): download it to open it in a viewer of that format.")
    return site.render(request, "profile.html", title=f"Profile {record.token or key}",
                       active="profiles", record=record, rows=rows, sort=sort, sorts=SORTS,
                       problem=problem, top=TOP)


def download(request: Request, site: Site) -> Response:
    key = request.path_params["key"]
    record = _record(site, key)
    try:
        data = ProfileSet(config=site.config).data(key)
    except ProfileNotFoundError:
        raise HTTPException(404, "this profile is gone (expired meanwhile)") from None
    except ProfileDataError as exc:
        raise HTTPException(422, str(exc)) from None
    name = safe_file_name(record.filename, key)
    if record.type != "cprofile":
        name = name.removesuffix(".prof") + ".json"
    return Response(data, media_type="application/octet-stream",
                    headers={"content-disposition": f'attachment; filename="{name}"'})


ROUTES = [
    Route("/profiles", page(profiles)),
    Route("/profiles/{key:str}", page(profile)),
    Route("/profiles/{key:str}/download", page(download)),
]

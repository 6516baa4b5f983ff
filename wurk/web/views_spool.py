"""The Spool pages: pushes spooled on this machine's disk, waiting to reach Redis.

The spool (:mod:`wurk.push.spool`) lives in ``spool_dir`` on the local
filesystem of each machine that pushes: this page shows the one of the
machine running ``wurk web``, and says so. Other machines' spools are
pushed by their own workers (or ``wurk spool push`` there).

Duties:
1. ``GET /spool``: the directory, the Redis this dashboard pushes to, and
   every spool file (as ``wurk spool list`` reads it, without claiming it):
   state, Redis it was written for, age, job count, flaw.
2. ``GET /spool/{file}``: one file's jobs (jid, queue, time, class,
   arguments), at most :data:`SHOWN`; a bad file shows its flaw.
3. ``POST /spool/push``: push every file of this Redis that no live
   process holds, as a worker would (:func:`wurk.push.spool_drain.drain_once`).
4. ``POST /spool/discard`` (``file`` named as listed, asked for first):
   claim the file, end its jobs with what their push took (as ``wurk spool
   discard`` does: :func:`wurk.admin.spool.discard_file`) and delete it;
   one a live drainer holds is left, and one Redis could not be told about
   is kept (the error is the page's answer).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.admin.spool import describe, discard_file
from wurk.api.records import JobRecord
from wurk.push import spool
from wurk.push.spool_drain import drain_once
from wurk.web.site import Site, action, page, redirect

SHOWN = 500


def _named(site: Site, file: str) -> spool.SpoolName:
    """The spool file listed under ``file``: never a path the form made up."""
    for name in spool.spool_files(spool.spool_dir(site.config)):
        if file in (name.path.name, f"{name.base}.spool"):
            return name
    raise HTTPException(404, "no such spool file (pushed, discarded or never here)")


def listing(request: Request, site: Site) -> Response:
    now = time.time()
    directory = spool.spool_dir(site.config)
    files = [describe(name, now) for name in spool.spool_files(directory)]
    return site.render(request, "spool.html", title="Spool", active="spool", files=files,
                       directory=str(directory), host=socket.gethostname(),
                       target=spool.target_of(site.config), now=now,
                       done=request.query_params.get("done", ""),
                       count=request.query_params.get("count", ""))


def _jobs(site: Site, name: spool.SpoolName) -> tuple[list[dict[str, Any]], str]:
    jobs: list[dict[str, Any]] = []
    try:
        with name.path.open("rb") as fh:
            header = spool.read_header(fh)
            for entry in spool.read_entries(fh, header):
                if len(jobs) >= SHOWN:
                    break
                record = JobRecord(entry.job, entry.queue, config=site.config)
                jobs.append({"jid": entry.jid, "queue": entry.queue, "at": entry.at,
                             "record": record})
    except spool.SpoolFormatError as exc:
        return jobs, str(exc)
    except OSError as exc:
        return jobs, f"cannot read: {exc.strerror}"
    return jobs, ""


def file_page(request: Request, site: Site) -> Response:
    name = _named(site, request.path_params["file"])
    info = describe(name, time.time())
    jobs, problem = _jobs(site, name)
    return site.render(request, "spool_file.html", title=f"Spool {info['file']}",
                       active="spool", info=info, jobs=jobs, problem=problem, shown=SHOWN,
                       host=socket.gethostname())


def push(request: Request, site: Site, form: FormData) -> Response:
    report = drain_once(site.config, site.runtime.pool)
    jobs = sum(len(jids) for _, jids in report.pushed)
    trouble = len(report.bad) + len(report.failed) + len(report.busy)
    return redirect(request, "/spool", done="spool-pushed" if not trouble else "spool-partial",
                    count=jobs)


def discard(request: Request, site: Site, form: FormData) -> Response:
    file = form.get("file")
    if not isinstance(file, str) or Path(file).name != file:
        raise HTTPException(400, "which file? the form needs its name as listed")
    held = spool.claim(_named(site, file))
    if held is None:
        return redirect(request, "/spool", done="spool-busy")
    discard_file(site.runtime, held)
    return redirect(request, "/spool", done="spool-discarded")


ROUTES = [
    Route("/spool", page(listing)),
    Route("/spool/push", action(push), methods=["POST"]),
    Route("/spool/discard", action(discard), methods=["POST"]),
    Route("/spool/{file:str}", page(file_page)),
]

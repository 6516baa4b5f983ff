"""The Swarms page: each live ``wurk-swarm`` parent, its slots and children.

Duties:
1. ``GET /swarms``: every live swarm (:class:`wurk.api.SwarmSet`) with host,
   pid, topology file, started, last beat and state (running, quiet,
   draining); per slot the children wanted and the ones alive; each child
   (read from its heartbeat, :class:`wurk.api.ProcessSet`) with pid, slot,
   index, RSS, age, busy and threads, last beat and quiet state.
2. ``POST /swarms/{verb}`` (``identity``): the swarm's remote control, which
   its parent obeys at its next beat: ``quiet`` (TSTP), ``restart`` (USR1,
   rolling, replacement first), ``more`` / ``fewer`` (TTIN / TTOU: one child
   more or fewer in every slot, within its limits, or with ``slot`` in
   that slot only) and ``stop`` (TERM).
3. Each child's restarts: how often a child at its slot and index exited
   and was respawned, as the swarm reports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from wurk.api import Process, ProcessSet, SwarmProcess, SwarmSet
from wurk.web.site import Site, action, page, redirect

SIGNALS = {"quiet": "TSTP", "restart": "USR1", "more": "TTIN", "fewer": "TTOU", "stop": "TERM"}


@dataclass(frozen=True)
class SlotView:
    name: str
    wanted: int
    children: list[Process]


@dataclass(frozen=True)
class SwarmView:
    swarm: SwarmProcess
    slots: list[SlotView]
    missing: list[str]  # registered children whose heartbeat is gone


def describe(swarm: SwarmProcess, live: dict[str, Process]) -> SwarmView:
    children = [live[i] for i in swarm.children if i in live]
    by_slot: dict[str, list[Process]] = {}
    for child in children:
        by_slot.setdefault(child.slot or "?", []).append(child)
    names = list(swarm.slots) + sorted(set(by_slot) - set(swarm.slots))
    slots = [SlotView(name, swarm.slots.get(name, 0),
                      sorted(by_slot.get(name, []), key=lambda p: (p.index or 0, p.pid)))
             for name in names]
    return SwarmView(swarm, slots, [i for i in swarm.children if i not in live])


def swarms(request: Request, site: Site) -> Response:
    live = {p.identity: p for p in ProcessSet(config=site.config)}
    views = [describe(s, live) for s in SwarmSet(config=site.config)]
    return site.render(request, "swarms.html", title="Swarms", active="swarms", swarms=views,
                       now=time.time(), done=request.query_params.get("done", ""))


def signal(request: Request, site: Site, form: FormData) -> Response:
    verb = request.path_params["verb"]
    if verb not in SIGNALS:
        raise HTTPException(404, "no such swarm action")
    identity = form.get("identity")
    swarm = SwarmSet(config=site.config).get(identity) if isinstance(identity, str) else None
    if swarm is None:
        raise HTTPException(404, "no live swarm with that identity")
    slot = form.get("slot")
    if slot is not None and verb in ("more", "fewer"):
        if not isinstance(slot, str) or slot not in swarm.slots:
            raise HTTPException(404, "that swarm has no slot of that name")
        swarm.scale(verb == "more", slot)
        return redirect(request, "/swarms", done=f"swarm-{verb}-slot")
    swarm.signal(SIGNALS[verb])
    return redirect(request, "/swarms", done=f"swarm-{verb}")


ROUTES = [
    Route("/swarms", page(swarms)),
    Route("/swarms/{verb:str}", action(signal), methods=["POST"]),
]

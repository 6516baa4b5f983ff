"""Commands that steer: ``wurk pause|unpause QUEUE``, ``quiet``, ``stop``, ``restart``, ``dump``.

Duties:
1. ``pause``/``unpause``: add every named queue to (remove it from) the
   ``paused`` set that fetchers skip. A queue nothing was pushed to yet can
   be paused (pausing ahead of a deploy is the point) and the output says
   so; unpausing a name that is neither known nor paused is a typo: exit 1.
2. Resolve who a control command is for: named process identities,
   ``--swarm IDENTITY`` for a whole swarm, or ``--all``: every live swarm
   and every live process that is not one of their children (a swarm's
   child is reached through its parent, which would otherwise respawn a
   stopped child, and quiet or drain it as one).
3. Queue the signal for each target (TSTP quiet, TERM stop, USR1 restart,
   TTIN dump); each acts on it at its next heartbeat. Name an unknown
   identity, or a process that cannot obey (an embedded one), and exit 1;
   with ``--all`` such a process is skipped and reported instead.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wurk.admin.registry import AdminCommand, CommandError, Context, UsageError
from wurk.api import (
    Process,
    ProcessControlError,
    ProcessSet,
    Queue,
    SwarmProcess,
    SwarmSet,
    UnknownProcessError,
    UnknownQueueError,
)
from wurk.settings.config import Config

Payload = dict[str, Any]


# -- pause / unpause --------------------------------------------------------------
def queue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queues", nargs="+", metavar="QUEUE")


def run_pause(ctx: Context, args: argparse.Namespace) -> None:
    _set_paused(ctx, args.queues, paused=True)


def run_unpause(ctx: Context, args: argparse.Namespace) -> None:
    _set_paused(ctx, args.queues, paused=False)


def _set_paused(ctx: Context, names: Sequence[str], *, paused: bool) -> None:
    for name in names:
        if not name.strip():
            raise UsageError(f"a queue name cannot be blank, got {name!r}")
    queues = [Queue.get(name, config=ctx.config) for name in names]
    unseen = [q.name for q in queues if not q.exists]
    if not paused:
        # Checked for every name before anything changes.
        for queue in queues:
            if queue.name in unseen and not queue.paused:
                raise UnknownQueueError(queue.name)
    for queue in queues:
        if paused:
            queue.pause()
        else:
            queue.unpause()
    ctx.emit({"action": "pause" if paused else "unpause", "queues": [q.name for q in queues],
              "unseen": unseen}, render_pause)


def render_pause(payload: Payload, now: float) -> list[str]:
    if payload["action"] != "pause":
        return [f"unpaused {name!r}" for name in payload["queues"]]
    unseen = set(payload.get("unseen", ()))
    return [f"paused {name!r}: fetchers skip it within a second; running jobs go on"
            + (" (nothing was pushed to it yet; it stays paused until unpaused)"
               if name in unseen else "")
            for name in payload["queues"]]


# -- targets -------------------------------------------------------------------------
@dataclass
class Targets:
    processes: list[Process] = field(default_factory=list)
    swarms: list[SwarmProcess] = field(default_factory=list)


def target_arguments(parser: argparse.ArgumentParser, *, processes: bool = True,
                     swarms: bool = True, everyone: bool = True) -> None:
    if processes:
        parser.add_argument("identities", nargs="*", metavar="IDENTITY",
                            help="a process identity, as `wurk processes` lists them")
    if swarms:
        parser.add_argument("--swarm", action="append", default=[], metavar="IDENTITY",
                            help="a swarm parent's identity (`wurk swarms`); repeatable")
    if everyone:
        parser.add_argument("--all", action="store_true",
                            help="every live swarm, and every process outside a swarm")


def resolve_targets(config: Config, args: argparse.Namespace) -> Targets:
    identities = getattr(args, "identities", [])
    named_swarms = getattr(args, "swarm", [])
    everyone = getattr(args, "all", False)
    if sum(map(bool, (identities, named_swarms, everyone))) != 1:
        raise UsageError(_usage_hint(args))
    if everyone:
        return _everyone(config, with_processes=hasattr(args, "identities"))
    swarms = SwarmSet(config=config)
    if named_swarms:
        return Targets(swarms=[swarms.lookup(identity) for identity in named_swarms])
    return Targets(processes=[_process(config, swarms, i) for i in identities])


def _usage_hint(args: argparse.Namespace) -> str:
    choices = [c for c, ok in (("IDENTITY", hasattr(args, "identities")),
                               ("--swarm IDENTITY", hasattr(args, "swarm")),
                               ("--all", hasattr(args, "all"))) if ok]
    if len(choices) == 1:
        return f"give at least one {choices[0]}"
    return f"give exactly one of {', '.join(choices)}"


def _process(config: Config, swarms: SwarmSet, identity: str) -> Process:
    process = ProcessSet(config=config).get(identity)
    if process is not None:
        return process
    if swarms.get(identity) is not None:
        raise CommandError(f"{identity!r} is a swarm, not a process: use --swarm {identity}")
    raise UnknownProcessError(identity)


def _everyone(config: Config, *, with_processes: bool) -> Targets:
    swarms = list(SwarmSet(config=config))
    if not with_processes:
        return Targets(swarms=swarms)
    children = {c for s in swarms for c in s.children}
    parents = {(s.hostname, s.pid) for s in swarms}
    processes = [p for p in ProcessSet(config=config) if p.identity not in children
                 and (p.hostname, p.info.get("swarm_pid")) not in parents]
    return Targets(processes, swarms)


# -- signalling ------------------------------------------------------------------------
@dataclass(frozen=True)
class Verb:
    name: str
    signal: str
    done: str  # what a person reads: "quiet (take no new jobs)", ...
    # Quiet and stop belong to an embedded process's host (as in Sidekiq 8).
    embedded_ok: bool = True


QUIET = Verb("quiet", "TSTP", "quiet (take no new jobs)", embedded_ok=False)
STOP = Verb("stop", "TERM", "stop (finish or push back running jobs, then exit)",
            embedded_ok=False)
RESTART = Verb("restart", "USR1", "restart every child, one at a time")
DUMP = Verb("dump", "TTIN", "log every thread's stack")


def send(ctx: Context, verb: Verb, targets: Targets, *, everyone: bool) -> None:
    """Check every target can obey, then queue the signal for each."""
    processes, skipped = _obedient(verb, targets.processes, everyone=everyone)
    swarms, stale = _beating(targets.swarms, everyone=everyone)
    for process in processes:
        _deliver(process, verb)
    for swarm in swarms:
        swarm.signal(verb.signal)
    ctx.emit({"command": verb.name, "signal": verb.signal,
              "processes": [p.identity for p in processes],
              "swarms": [s.identity for s in swarms], "skipped": skipped + stale},
             lambda payload, now: render_sent(payload, verb))


def _obedient(verb: Verb, processes: list[Process], *,
              everyone: bool) -> tuple[list[Process], list[dict[str, str]]]:
    """The processes that can obey ``verb``, and the reasons the others are skipped.

    A named process that cannot obey is an error, raised before anything is sent.
    """
    refused = {p.identity: _refusal(verb, p) for p in processes if not verb.embedded_ok
               and p.embedded}
    if refused and not everyone:
        raise ProcessControlError(next(iter(refused.values())))
    skipped = [{"identity": identity, "reason": reason} for identity, reason in refused.items()]
    return [p for p in processes if p.identity not in refused], skipped


def _beating(swarms: list[SwarmProcess], *,
             everyone: bool) -> tuple[list[SwarmProcess], list[dict[str, str]]]:
    """The swarms still beating, and the stale ones as skipped; a named stale one is an error.

    A stale swarm's parent cannot read a signal: saying one was sent would be a lie.
    """
    stale = {s.identity: (f"swarm {s.identity} is stale: no beat for "
                          f"{max(0.0, time.time() - s.beat):.0f} s, so its parent is gone or "
                          "stuck; nothing was sent") for s in swarms if s.stale()}
    if stale and not everyone:
        raise ProcessControlError(next(iter(stale.values())))
    skipped = [{"identity": identity, "reason": reason} for identity, reason in stale.items()]
    return [s for s in swarms if s.identity not in stale], skipped


def _refusal(verb: Verb, process: Process) -> str:
    return (f"can't {verb.name} embedded process {process.identity}: it runs inside "
            "another program (a web server), which owns its lifecycle")


def _deliver(process: Process, verb: Verb) -> None:
    if verb is QUIET:
        process.quiet()
    elif verb is STOP:
        process.stop()
    else:
        process.signal(verb.signal)


def render_sent(payload: Payload, verb: Verb) -> list[str]:
    lines = [f"{verb.signal} sent to process {i}: {verb.done} at its next heartbeat"
             for i in payload["processes"]]
    lines += [f"{verb.signal} sent to swarm {i}: {verb.done} at its next beat"
              for i in payload["swarms"]]
    lines += [f"skipped {s['identity']}: {s['reason']}" for s in payload["skipped"]]
    return lines or ["nothing to signal: no live process or swarm"]


def control_command(verb: Verb, help_text: str, *, processes: bool = True,
                    swarms: bool = True, everyone: bool = True) -> AdminCommand:
    def run(ctx: Context, args: argparse.Namespace) -> None:
        send(ctx, verb, resolve_targets(ctx.config, args), everyone=getattr(args, "all", False))

    def arguments(parser: argparse.ArgumentParser) -> None:
        target_arguments(parser, processes=processes, swarms=swarms, everyone=everyone)
    return AdminCommand(verb.name, help_text, run, arguments)


COMMANDS = (
    AdminCommand("pause", "stop fetching from a queue (running jobs go on)", run_pause,
                 queue_arguments),
    AdminCommand("unpause", "resume fetching from a paused queue", run_unpause,
                 queue_arguments),
    control_command(QUIET, "quiet a process, a swarm (--swarm) or everything (--all)"),
    control_command(STOP, "stop a process, drain a swarm (--swarm) or everything (--all)"),
    control_command(RESTART, "rolling restart of a swarm (--swarm) or every swarm (--all)",
                    processes=False),
    control_command(DUMP, "have a process log every thread's stack", swarms=False,
                    everyone=False),
)

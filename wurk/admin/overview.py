"""Read-only admin commands: ``wurk stats``, ``queues``, ``processes``, ``workers``, ``swarms``.

Duties:
1. Build each command's ``--json`` payload from ``wurk.api`` (the shapes
   are documented in docs/reference/admin-cli.md and must stay stable).
2. Render the same payload as an aligned table for a person.
3. Count only live processes and swarms (heartbeat unexpired), so a
   crashed process never inflates a figure.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from wurk.admin.output import clip, duration, fields, megabytes, table, when
from wurk.admin.registry import AdminCommand, Context
from wurk.api import ProcessSet, Stats, SwarmSet, Workers
from wurk.settings.config import Config
from wurk.wire import keys
from wurk.wire.payload import latency_of
from wurk.wire.replies import sscan_all

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.redis.runtime import Runtime

Payload = dict[str, Any]
COUNTS = ("processed", "failed", "enqueued", "scheduled", "retries", "dead", "processes", "busy")


# -- stats ---------------------------------------------------------------------
def stats_payload(config: Config) -> Payload:
    stats = Stats(config=config)
    live = list(ProcessSet(config=config))
    return {"processed": stats.processed, "failed": stats.failed, "enqueued": stats.enqueued,
            "scheduled": stats.scheduled_size, "retries": stats.retry_size,
            "dead": stats.dead_size, "processes": len(live),
            "busy": sum(p.busy for p in live),
            "default_queue_latency": round(stats.default_queue_latency, 3)}


def render_stats(payload: Payload, now: float) -> list[str]:
    rows = [(name, payload[name]) for name in COUNTS]
    rows.append(("default queue latency", duration(payload["default_queue_latency"])))
    return fields(rows)


def run_stats(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(stats_payload(ctx.config), render_stats)


# -- queues ----------------------------------------------------------------------
def queues_payload(runtime: Runtime) -> list[Payload]:
    queues: list[Payload] = runtime.pool.run(_read_queues, idempotent=True)
    return queues


def _read_queues(conn: Conn) -> list[Payload]:
    """Size, oldest job and paused flag of every queue, in one pipeline."""
    names = sscan_all(conn, keys.QUEUES)
    replies = conn.pipeline([command for name in names for command in (
        ("LLEN", keys.queue(name)), ("LINDEX", keys.queue(name), -1),
        ("SISMEMBER", keys.PAUSED, name))])
    return [{"name": name, "size": int(replies[3 * i]),
             "latency": round(latency_of(replies[3 * i + 1]), 3),
             "paused": bool(replies[3 * i + 2])} for i, name in enumerate(names)]


def render_queues(payload: list[Payload], now: float) -> list[str]:
    rows = [(q["name"], q["size"], duration(q["latency"]), "paused" if q["paused"] else "")
            for q in payload]
    return table(("QUEUE", "SIZE", "LATENCY", "PAUSED"), rows, empty="no queues")


def run_queues(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(queues_payload(ctx.runtime), render_queues)


# -- processes ---------------------------------------------------------------------
def processes_payload(config: Config) -> list[Payload]:
    return [{"identity": p.identity, "hostname": p.hostname, "pid": p.pid, "tag": p.tag,
             "labels": p.labels, "queues": p.queues, "concurrency": p.concurrency,
             "busy": p.busy, "quiet": p.is_quiet, "rss_kb": p.rss, "beat": p.beat,
             "started_at": p.started_at, "version": p.version, "embedded": p.embedded,
             "slot": p.slot, "index": p.index, "swarm_pid": p.info.get("swarm_pid")}
            for p in ProcessSet(config=config)]


def render_processes(payload: list[Payload], now: float) -> list[str]:
    rows = [(p["identity"], _tag(p), _slot(p), clip(",".join(p["queues"]), 30),
             f"{p['busy']}/{p['concurrency']}", "quiet" if p["quiet"] else "running",
             megabytes(p["rss_kb"]), when(p["started_at"], now), when(p["beat"], now))
            for p in payload]
    return table(("IDENTITY", "TAG", "SLOT", "QUEUES", "BUSY", "STATE", "RSS", "STARTED",
                  "BEAT"), rows, empty="no live processes")


def _tag(process: Payload) -> str:
    return process["tag"] or ("embedded" if process["embedded"] else "-")


def _slot(process: Payload) -> str:
    """A swarm child's slot and index; "-" for a process on its own."""
    if process["slot"] is None:
        return "-"
    return f"{process['slot']}#{process['index']}"


def run_processes(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(processes_payload(ctx.config), render_processes)


# -- workers -------------------------------------------------------------------------
def workers_payload(config: Config) -> list[Payload]:
    return [{"process": entry.process, "thread": entry.thread, "queue": entry.work.queue,
             "jid": entry.work.job.jid, "class": entry.work.job.klass,
             "args": entry.work.job.display_args, "run_at": entry.work.run_at}
            for entry in Workers(config=config)]


def render_workers(payload: list[Payload], now: float) -> list[str]:
    rows = [(w["process"], w["thread"], w["queue"], w["class"], w["jid"], clip(w["args"], 40),
             duration(now - w["run_at"])) for w in payload]
    return table(("PROCESS", "THREAD", "QUEUE", "CLASS", "JID", "ARGS", "RUNNING FOR"), rows,
                 empty="no jobs running")


def run_workers(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(workers_payload(ctx.config), render_workers)


# -- swarms ---------------------------------------------------------------------------
def swarms_payload(config: Config) -> list[Payload]:
    return [{"identity": s.identity, "hostname": s.hostname, "pid": s.pid, "state": s.state,
             "started_at": s.started_at, "beat": s.beat, "topology": s.topology,
             "slots": s.slots, "children": s.children}
            for s in SwarmSet(config=config)]


def render_swarms(payload: list[Payload], now: float) -> list[str]:
    rows = [(s["identity"], s["state"], " ".join(f"{k}={v}" for k, v in s["slots"].items()),
             len(s["children"]), when(s["started_at"], now), when(s["beat"], now),
             s["topology"]) for s in payload]
    return table(("IDENTITY", "STATE", "SLOTS", "CHILDREN", "STARTED", "BEAT", "TOPOLOGY"),
                 rows, empty="no live swarms")


def run_swarms(ctx: Context, args: argparse.Namespace) -> None:
    ctx.emit(swarms_payload(ctx.config), render_swarms)


COMMANDS = (
    AdminCommand("stats", "cluster totals: processed, failed, enqueued, set sizes", run_stats),
    AdminCommand("queues", "every queue with its size, latency and paused flag", run_queues),
    AdminCommand("processes", "live worker processes (wurk run, swarm children, Sidekiq)",
                 run_processes),
    AdminCommand("workers", "jobs running right now, by process and thread", run_workers),
    AdminCommand("swarms", "live wurk-swarm parents with their slots and children",
                 run_swarms),
)

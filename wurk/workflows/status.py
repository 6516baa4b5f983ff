"""Workflows, the status side: ``wurk.Workflow.status(wid)`` and the list of workflows.

Duties:
1. :func:`read`: one workflow's state, its steps (pending, running,
   succeeded, failed, skipped), its failures with their errors, and the
   results of its last steps when they were stored.
2. :func:`recent`: the newest workflow ids of the index, with their state;
   :func:`summaries` one page of the index with each workflow's record
   (state, policy, description, times) in one round trip, and :func:`count`.
Everything is read from Redis without trusting it: a garbled record shows
as unreadable, never raises past WorkflowError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from wurk.core.validate import is_text
from wurk.push.client import Client
from wurk.results import records as results_wire
from wurk.workflows import keys
from wurk.workflows.spec import WorkflowError, load, pairs, successors, text

__all__ = ["StepStatus", "WorkflowStatus", "WorkflowSummary", "count", "read", "recent",
           "summaries"]


@dataclass(frozen=True)
class StepStatus:
    name: str
    job: str
    state: str  # pending, launching, running, succeeded, failed, skipped
    jobs: int
    bid: str | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class WorkflowStatus:
    wid: str
    state: str  # running, succeeded, failed, stopped
    policy: str
    description: str
    created_at: float
    finished_at: float | None
    stopped_by: str | None
    steps: dict[str, StepStatus] = field(default_factory=dict)
    # The results of the last steps (those nothing waits for), by step, where stored.
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> list[StepStatus]:
        return [s for s in self.steps.values() if s.state == "failed"]

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow as the index lists it; ``state`` is "expired" once its record is gone."""

    wid: str
    state: str
    policy: str = ""
    description: str = ""
    created_at: float | None = None
    finished_at: float | None = None
    stopped_by: str | None = None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def read(client: Client, wid: str) -> WorkflowStatus:
    if not is_text(wid, 64):
        raise WorkflowError(f"a workflow id is a string of 1 to 64 characters, got {wid!r}")
    flow = load(client, wid)
    meta = dict(pairs(client.pool.call("HGETALL", keys.key(wid), idempotent=True)))
    records = dict(pairs(client.pool.call("HGETALL", keys.key(wid, "steps"),
                                           idempotent=True)))
    ends = dict(pairs(client.pool.call("HGETALL", keys.key(wid, "ends"), idempotent=True)))
    finished = _float(meta.get("finished_at"))
    steps: dict[str, StepStatus] = {}
    for name, body in flow["steps"].items():
        try:
            record = json.loads(records[name]) if name in records else {}
        except ValueError:
            record = {"state": "unreadable"}
        record = record if isinstance(record, dict) else {"state": "unreadable"}
        state = str(record.get("state") or ("skipped" if finished else "pending"))
        if name in ends:  # the end recorded once wins over a record written late
            state = "succeeded" if ends[name] == "success" else "failed"
        error = record.get("error") if isinstance(record.get("error"), dict) else None
        bid = record.get("bid") if isinstance(record.get("bid"), str) else None
        steps[name] = StepStatus(name, body["job"], state, len(body["args"]), bid, error)
    return WorkflowStatus(wid, str(meta.get("state", "unknown")), flow["policy"],
                          str(flow.get("description", "")), _float(meta.get("created_at")) or 0.0,
                          finished, meta.get("stopped_by"), steps,
                          _last_results(client, wid, flow, steps))


def _last_results(client: Client, wid: str, flow: dict[str, Any],
                  steps: dict[str, StepStatus]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jids = dict(pairs(client.pool.call("HGETALL", keys.key(wid, "jids"), idempotent=True)))
    for name, after in successors(flow["steps"]).items():
        if after or steps[name].state != "succeeded" or name not in jids:
            continue
        try:
            listed = json.loads(jids[name])[:1000]
            raws = client.pool.call("MGET", *[results_wire.key(str(j)) for j in listed],
                                    idempotent=True)
            values = [results_wire.parse(str(j), raw).value
                      for j, raw in zip(listed, raws, strict=True) if raw is not None]
        except (ValueError, TypeError, results_wire.CorruptResultError):
            continue
        if len(values) == len(listed):
            out[name] = values[0] if len(values) == 1 else values
    return out


def recent(client: Client, limit: int = 50) -> list[tuple[str, str]]:
    """The newest ``limit`` workflows: (wid, state), newest first."""
    wids = client.pool.call("ZREVRANGE", keys.INDEX, 0, max(limit, 1) - 1, idempotent=True)
    out = []
    for raw in wids:
        wid = raw.decode() if isinstance(raw, bytes) else str(raw)
        state = client.pool.call("HGET", keys.key(wid), "state", idempotent=True)
        out.append((wid, (state.decode() if isinstance(state, bytes) else state) or "expired"))
    return out


def count(client: Client) -> int:
    """Workflows in the index (some may have expired since)."""
    return int(client.pool.call("ZCARD", keys.INDEX, idempotent=True) or 0)


def summaries(client: Client, limit: int = 25, offset: int = 0) -> list[WorkflowSummary]:
    """One page of the index, newest first, each with its record (one round trip more).

    A record of the wrong type or with garbage fields shows as state
    "unreadable" or with the field left empty, never raises.
    """
    wids = [text(raw) for raw in client.pool.call(
        "ZREVRANGE", keys.INDEX, max(offset, 0), max(offset, 0) + max(limit, 1) - 1,
        idempotent=True) or []]
    if not wids:
        return []
    replies = client.pool.run(lambda c: c.pipeline(
        [("HGETALL", keys.key(wid)) for wid in wids], raise_on_error=False), idempotent=True)
    out = []
    for wid, reply in zip(wids, replies, strict=True):
        if isinstance(reply, Exception):
            out.append(WorkflowSummary(wid, "unreadable"))
            continue
        meta = dict(pairs(reply))
        out.append(WorkflowSummary(
            wid, meta.get("state") or ("unknown" if meta else "expired"), meta.get("policy", ""),
            meta.get("description", ""), _float(meta.get("created_at")),
            _float(meta.get("finished_at")), meta.get("stopped_by") or None))
    return out

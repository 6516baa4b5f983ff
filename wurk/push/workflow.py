"""Workflows: chains, chords and DAGs of steps, run on batches and their callbacks.

``wurk.Workflow(wurk.step(fetch, url) >> wurk.group(parse, shards, results=True)
>> wurk.step(merge, results=True), policy="stop").start()`` validates the
whole DAG (:mod:`wurk.push.workflow_spec`), then makes the root batch (its
``workflow`` field holds the definition, a hold keeps it open to the end)
and launches the steps that wait for nothing. Each step is a batch, child
of the root, whose ``success`` and ``death`` callbacks are the internal job
``wurk.workflow.advance``. Nothing polls: the batch Lua fires a callback
once, the advance job moves the workflow on.

Duties:
1. :class:`Workflow`: check everything before the first write; ``start``
   makes the root batch and the workflow's keys (:mod:`wurk.wire.workflow`),
   launches the first steps and returns the workflow id (the root's bid).
2. :func:`advance` (the internal job): record the step's end once (Lua
   ``workflow_end``), launch each step it released, unless the "stop"
   policy stopped the workflow; when every step is resolved, write the
   final state once and drop the root's hold. Idempotent: a rerun after a
   SIGKILL finds the end recorded and re-launches only what it owns, with
   the same bids, hold and jids, so nothing runs twice.
3. Pass results: a step with ``results=True`` gets, as first argument, the
   result of the step before it (a list for a group) or a dict by step name
   when it waits for several; those steps' jobs are pushed with
   ``result_ttl``. A result that expired or was never stored fails the step
   with an error that says so, under the workflow's policy.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from wurk.core.logging import get_logger
from wurk.push.batch import Batch
from wurk.push.batch_step import BatchError, run
from wurk.push.client import Client
from wurk.push.job import job, registry
from wurk.push.workflow_spec import (
    POLICIES,
    WorkflowError,
    definition,
    load,
    order,
    pairs,
    successors,
    text,
    validate,
)
from wurk.push.workflow_status import WorkflowStatus, read
from wurk.wire import batch as batch_wire
from wurk.wire import results as results_wire
from wurk.wire import workflow as wire
from wurk.wire.batch_lua import REMOVE
from wurk.wire.payload import dumps, new_jid

__all__ = ["Workflow", "WorkflowError", "advance"]

log = get_logger("wurk.workflow")
_FINAL = ("succeeded", "failed")


class Workflow:
    """A workflow to start; see the module docstring and docs/how-to/workflows.md."""

    def __init__(self, spec: Any, *, description: str | None = None, policy: str = "stop",
                 queue: str = "default", result_ttl: int = results_wire.DEFAULT_TTL,
                 expires_in: float = batch_wire.EXPIRY, client: Client | None = None) -> None:
        if policy not in POLICIES:
            raise WorkflowError(f"policy must be one of {POLICIES}, got {policy!r}")
        if description is not None and not isinstance(description, str):
            raise WorkflowError(f"description must be a str, got {description!r}")
        if not isinstance(queue, str) or not queue:
            raise WorkflowError(f"queue must be a non-empty str, got {queue!r}")
        if isinstance(result_ttl, bool) or not isinstance(result_ttl, int) \
                or not 1 <= result_ttl <= results_wire.MAX_TTL:
            raise WorkflowError(f"result_ttl must be 1 to {results_wire.MAX_TTL} seconds")
        self.client = client or Client.default()
        self.expires_in = expires_in
        self.definition: dict[str, Any] = {
            "v": 1, "policy": policy, "queue": queue, "result_ttl": result_ttl,
            "description": description or "", "steps": validate(definition(spec))}
        self.wid: str | None = None

    def start(self) -> str:
        """Make the root batch and launch the first steps; the workflow id."""
        wid = secrets.token_urlsafe(10)
        steps = self.definition["steps"]
        Batch(self.definition["description"] or f"workflow {wid}", parent=None,
              workflow=self.definition, callback_queue=self.definition["queue"],
              expires_in=self.expires_in, client=self.client, _fixed=(wid, wire.ROOT_HOLD))
        ttl = int(self.expires_in)

        now = f"{time.time():.6f}"
        commands: list[list[Any]] = [["HSET", wire.key(wid), "policy", self.definition["policy"],
                                      "state", "running", "created_at", now, "description",
                                      self.definition["description"]]]
        waiting = [x for n, s in steps.items() if s["after"] for x in (n, len(s["after"]))]
        if waiting:
            commands.append(["HSET", wire.key(wid, "waiting"), *waiting])
        commands += [["EXPIRE", name, ttl] for name in wire.all_keys(wid)]
        commands.append(["ZADD", wire.INDEX, now, wid])
        self.client.pool.pipeline(commands, idempotent=True)
        for name, body in steps.items():
            if not body["after"]:
                _launch(self.client, wid, self.definition, name)
        self.wid = wid
        return wid

    @staticmethod
    def status(wid: str, *, client: Client | None = None) -> WorkflowStatus:
        """The workflow's :class:`~wurk.push.workflow_status.WorkflowStatus`."""
        return read(client or Client.default(), wid)

    def __repr__(self) -> str:
        count = len(self.definition["steps"])
        return f"<wurk.Workflow {self.wid or '(not started)'} {count} steps>"


@job(name=wire.ADVANCE, queue="default")
def advance(status: Mapping[str, Any], wid: str, name: str, event: str) -> None:
    """The internal callback of every step batch: move the workflow on."""
    client = Client.default()
    flow = load(client, wid)
    if name not in flow["steps"] or event not in ("success", "death"):
        raise WorkflowError(f"workflow {wid} has no step {name!r} (event {event!r})")
    error = _death_error(client, status) if event == "death" else None
    _end(client, wid, flow, name, event, error=error)


def _death_error(client: Client, status: Mapping[str, Any]) -> dict[str, Any]:
    bid = status.get("bid") if isinstance(status, Mapping) else None
    if not batch_wire.valid_bid(bid):
        return {"class": "unknown", "message": "the step's job died"}
    infos = client.pool.call("HGETALL", batch_wire.key(str(bid), batch_wire.FAILINFO),
                             idempotent=True)
    for jid, raw in pairs(infos):
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        if isinstance(info, dict):
            return {"jid": jid, "class": str(info.get("class", ""))[:200],
                    "message": str(info.get("message", ""))[:1000]}
    return {"class": "unknown", "message": "the step's job died"}


def _record(client: Client, wid: str, name: str, **fields: Any) -> None:
    old = client.pool.call("HGET", wire.key(wid, "steps"), name, idempotent=True)
    try:
        record = json.loads(old) if old else {}
    except ValueError:
        record = {}
    record = {**(record if isinstance(record, dict) else {}), **fields}
    client.pool.call("HSET", wire.key(wid, "steps"), name, dumps(record), idempotent=True)


def _end(client: Client, wid: str, flow: dict[str, Any], name: str, outcome: str, *,
         error: dict[str, Any] | None) -> None:
    steps = flow["steps"]
    after = successors(steps)[name]
    client.pool.run(lambda c: wire.END.run(c, [], [wid, name, outcome, flow["policy"], *after]),
                    idempotent=True)
    # The first end stands: a dead job retried by hand from the morgue later moves nothing.
    recorded = client.pool.call("HGET", wire.key(wid, "ends"), name, idempotent=True)
    if text(recorded or "") != outcome:
        log.warning("workflow.late_end", wid=wid, step=name, outcome=outcome,
                    recorded=text(recorded or ""))
        return
    _record(client, wid, name, state="succeeded" if outcome == "success" else "failed",
            error=error, ended_at=time.time())
    if outcome == "success":
        owners = client.pool.call("HGETALL", wire.key(wid, "owner"), idempotent=True)
        owned = {k for k, v in pairs(owners) if v == name}
        stopped = client.pool.call("HGET", wire.key(wid), "stopped_by", idempotent=True)
        for nxt in after:
            if nxt in owned and not stopped:
                _launch(client, wid, flow, nxt)
    _maybe_finish(client, wid, flow)


def _launch(client: Client, wid: str, flow: dict[str, Any], name: str) -> None:
    """Launch step ``name``: replayable (fixed bid, hold and jids)."""
    steps = flow["steps"]
    body = steps[name]
    ends = client.pool.call("HEXISTS", wire.key(wid, "ends"), name, idempotent=True)
    if ends:
        return
    _record(client, wid, name, state="launching")
    jids = _jids(client, wid, name, len(body["args"]))
    first, error = (_inputs(client, wid, flow, name) if body["results"] else (None, None))
    if error is not None:
        _end(client, wid, flow, name, "death", error=error)
        return
    bid = f"{wid}.{list(steps).index(name)}"
    try:
        step_batch = Batch(f"workflow {wid} step {name}", parent=wid, client=client,
                           on_success=(wire.ADVANCE, [wid, name, "success"]),
                           on_death=(wire.ADVANCE, [wid, name, "death"]),
                           callback_queue=flow["queue"], workflow={"wid": wid, "step": name},
                           _fixed=(bid, wire.STEP_HOLD))
    except BatchError as exc:
        if "already exists" in str(exc):
            return  # launched and let go by an earlier run of this same advance
        raise
    counted = client.pool.call("HGET", batch_wire.key(bid), "total", idempotent=True)
    if not counted or int(counted) == 0:
        entry = registry.find(body["job"])
        fields = entry.options.payload_fields() if entry else {"queue": "default"}
        if any(steps[n]["results"] for n in successors(steps)[name]):
            fields["result_ttl"] = flow.get("result_ttl", results_wire.DEFAULT_TTL)
        for jid, args in zip(jids, body["args"], strict=True):
            full = [first, *args] if body["results"] else list(args)
            step_batch.push({**fields, "class": body["job"], "args": full, "jid": jid})
    _record(client, wid, name, state="running", bid=bid, jobs=len(jids))
    run(client.pool, REMOVE, [bid, wire.STEP_HOLD])


def _jids(client: Client, wid: str, name: str, count: int) -> list[str]:
    fresh = dumps([new_jid() for _ in range(count)])
    client.pool.call("HSETNX", wire.key(wid, "jids"), name, fresh, idempotent=True)
    stored = client.pool.call("HGET", wire.key(wid, "jids"), name, idempotent=True)
    jids = json.loads(stored)
    if not isinstance(jids, list) or len(jids) != count:
        raise WorkflowError(f"workflow {wid}: the stored jids of step {name!r} are unusable")
    return [str(j) for j in jids]


def _inputs(client: Client, wid: str, flow: dict[str, Any],
            name: str) -> tuple[Any, dict[str, Any] | None]:
    """The first argument of a results step, or the error that fails it."""
    values: dict[str, Any] = {}
    for before in flow["steps"][name]["after"]:
        jids = _jids(client, wid, before, len(flow["steps"][before]["args"]))
        got: list[Any] = []
        for start in range(0, len(jids), 1000):
            part = jids[start:start + 1000]
            raws = client.pool.call("MGET", *[results_wire.key(j) for j in part],
                                    idempotent=True)
            for jid, raw in zip(part, raws, strict=True):
                problem = _missing(before, jid, raw)
                if problem:
                    return None, {"jid": jid, "class": "wurk.MissingResult", "message": problem}
                got.append(results_wire.parse(jid, raw).value)
        values[before] = got[0] if len(flow["steps"][before]["args"]) == 1 else got
    after = flow["steps"][name]["after"]
    return (values[after[0]] if len(after) == 1 else values), None


def _missing(step: str, jid: str, raw: Any) -> str | None:
    if raw is None:
        return (f"the result of step {step!r} (job {jid}) is not stored: it expired "
                f"(result_ttl) or was never stored")
    try:
        outcome = results_wire.parse(jid, raw)
    except results_wire.CorruptResultError as exc:
        return f"the result of step {step!r} is unreadable: {exc}"
    if not outcome.succeeded:
        return (f"the result of step {step!r} (job {jid}) is an error: "
                f"{outcome.error_class}: {outcome.error_message}")
    return None


def _maybe_finish(client: Client, wid: str, flow: dict[str, Any]) -> None:
    """When every step is resolved, write the final state once and let the root go."""
    ends = dict(pairs(client.pool.call("HGETALL", wire.key(wid, "ends"), idempotent=True)))
    records = dict(pairs(client.pool.call("HGETALL", wire.key(wid, "steps"), idempotent=True)))
    stopped = client.pool.call("HGET", wire.key(wid), "stopped_by", idempotent=True)
    steps = flow["steps"]
    blocked: set[str] = set()
    for name in order(steps):
        if name in ends:
            continue
        launched = name in records
        if launched:
            return  # still running
        if stopped or any(ends.get(b) == "death" or b in blocked for b in steps[name]["after"]):
            blocked.add(name)
            continue
        return  # released, about to be launched
    failed = any(v == "death" for v in ends.values())
    state = "stopped" if stopped else "failed" if failed else "succeeded"
    if client.pool.call("HSETNX", wire.key(wid), "finished_at", f"{time.time():.6f}",
                        idempotent=True):
        client.pool.call("HSET", wire.key(wid), "state", state, idempotent=True)
        for name in wire.all_keys(wid):
            client.pool.call("EXPIRE", name, wire.LINGER, idempotent=True)
        log.info("workflow.finished", wid=wid, state=state, failed=sorted(
            n for n, v in ends.items() if v == "death"), skipped=sorted(blocked))
    run(client.pool, REMOVE, [wid, wire.ROOT_HOLD])

"""Workflows: chains, chords and DAGs of steps, run on batches and their callbacks.

``wurk.Workflow(wurk.step(fetch, url) >> wurk.group(parse, shards, results=True)
>> wurk.step(merge, results=True), policy="stop").start()`` validates the
whole DAG (:mod:`wurk.workflows.spec`), then makes the root batch (its
``workflow`` field holds the definition, a hold keeps it open to the end)
and launches the steps that wait for nothing. Each step is a batch, child
of the root, whose ``success`` and ``death`` callbacks are the internal job
``wurk.workflow.advance``. Nothing polls: the batch Lua fires a callback
once, the advance job moves the workflow on.

Duties:
1. :class:`Workflow`: check everything before the first write; ``start``
   makes the root batch and the workflow's keys (:mod:`wurk.workflows.keys`)
   and launches the first steps in one MULTI/EXEC of guarded scripts (all
   or nothing, safe to send again), and returns the workflow id (the
   root's bid, fixed when the object is made).
2. :func:`advance` (the internal job): record the step's end once (Lua
   ``workflow_end``), launch each step it released, unless the "stop"
   policy stopped the workflow; when every step is resolved, write the
   final state and drop the root's hold. A launch is one script (Lua
   ``batch_launch``: the step's batch, its jobs counted and written, its
   guard), so a rerun after a SIGKILL finds the end recorded and the
   launch either done (nothing is written again) or not begun.
3. Pass results: a step with ``results=True`` gets, as first argument, the
   result of the step before it (a list for a group) or a dict by step name
   when it waits for several; those steps' jobs are pushed with
   ``result_ttl`` (the workflow's, at most its remaining lifetime). A result
   that expired or was never stored fails the step with an error that says
   so, under the workflow's policy. A result stored only for the steps after
   it (its job did not ask for results) is deleted when the workflow ends.
4. Keep the index bounded: a finished workflow's index entry is retired
   (``wurk:workflows:retire``) when its keys are set to linger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis.exceptions as rx

from wurk.batches import keys as batch_keys
from wurk.batches.client import Batch
from wurk.batches.lua import REMOVE
from wurk.batches.push import BatchError, refusal, run, write_tail
from wurk.batches.push_lua import LAUNCH
from wurk.core.logging import get_logger
from wurk.core.validate import is_whole
from wurk.push.client import Client
from wurk.push.job import job, registry
from wurk.push.prepare import Prepared, as_push
from wurk.results import records as results_wire
from wurk.wire.lua import Script
from wurk.wire.payload import dumps, new_jid
from wurk.workflows import keys
from wurk.workflows.results_client import (
    PASSED,
    drop_passed_results,
    inputs,
    keep_for_successors,
    step_jids,
)
from wurk.workflows.spec import (
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
from wurk.workflows.status import WorkflowStatus, read

__all__ = ["Workflow", "WorkflowError", "advance"]

log = get_logger("wurk.workflow")
_FINAL = ("succeeded", "failed")
LEGACY_STEP_HOLD = "hold:workflow-step"  # a step's hold before launches were one script


class Workflow:
    """A workflow to start; see the module docstring and docs/how-to/workflows.md."""

    def __init__(self, spec: Any, *, description: str | None = None, policy: str = "stop",
                 queue: str = "default", result_ttl: int = results_wire.DEFAULT_TTL,
                 expires_in: float = batch_keys.EXPIRY, client: Client | None = None) -> None:
        if policy not in POLICIES:
            raise WorkflowError(f"policy must be one of {POLICIES}, got {policy!r}")
        if description is not None and not isinstance(description, str):
            raise WorkflowError(f"description must be a str, got {description!r}")
        if not isinstance(queue, str) or not queue:
            raise WorkflowError(f"queue must be a non-empty str, got {queue!r}")
        if not is_whole(result_ttl) or not 1 <= result_ttl <= results_wire.MAX_TTL:
            raise WorkflowError(f"result_ttl must be 1 to {results_wire.MAX_TTL} seconds")
        self.client = client or Client.default()
        self.expires_in = expires_in
        self.definition: dict[str, Any] = {
            "v": 1, "policy": policy, "queue": queue, "result_ttl": result_ttl,
            "description": description or "", "steps": validate(definition(spec))}
        self.wid: str | None = None  # set once started
        self._wid = batch_keys.new_bid()  # fixed now: start() again replays, never forks

    def start(self) -> str:
        """Make the root batch and launch the first steps; the workflow id.

        One MULTI/EXEC of guarded scripts: a crash before it leaves nothing,
        after it everything; a lost reply is replayed (each part finds its
        guard and writes nothing twice), and so is calling ``start`` again on
        this object after it raised: the wid is fixed when the object is made.
        """
        if self.wid is not None:
            return self.wid
        wid, ttl = self._wid, int(self.expires_in)
        steps = self.definition["steps"]
        root = Batch(self.definition["description"] or f"workflow {wid}", parent=None,
                     workflow=self.definition, callback_queue=self.definition["queue"],
                     expires_in=self.expires_in, client=self.client,
                     _fixed=(wid, keys.ROOT_HOLD), _write=False)
        now = f"{time.time():.6f}"
        fields = ["policy", self.definition["policy"], "state", "running",
                  "description", self.definition["description"]]
        waiting = [x for n, s in steps.items() if s["after"] for x in (n, len(s["after"]))]
        scripts: list[tuple[Script, list[Any]]] = [
            (keys.INIT, [wid, ttl, now, now, len(fields) // 2, *fields, *waiting]),
            (LAUNCH, _launch_args(wid, ttl, keys.ROOT_FIELD, root, []))]
        records: list[tuple[Any, ...]] = []
        for name, body in steps.items():
            if not body["after"]:
                jids = [new_jid() for _ in body["args"]]
                args, record = _step(self.client, wid, self.definition, name, None,
                                     jids=jids, ttl=ttl)
                scripts.append((LAUNCH, args))
                records += [("HSETNX", keys.key(wid, "steps"), name, record),
                            ("HSETNX", keys.key(wid, "jids"), name, dumps(jids))]
        records += [("EXPIRE", keys.key(wid, part), ttl) for part in ("steps", "jids")]
        _at("start")
        _atomically(self.client, [("EVAL", script.source, 0, *args) for script, args in scripts]
                    + records)
        _at("started")
        self.wid = wid
        return wid

    @staticmethod
    def status(wid: str, *, client: Client | None = None) -> WorkflowStatus:
        """The workflow's :class:`~wurk.workflows.status.WorkflowStatus`."""
        return read(client or Client.default(), wid)

    def __repr__(self) -> str:
        count = len(self.definition["steps"])
        return f"<wurk.Workflow {self.wid or '(not started)'} {count} steps>"


@job(name=keys.ADVANCE, queue="default")
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
    if not batch_keys.valid_bid(bid):
        return {"class": "unknown", "message": "the step's job died"}
    infos = client.pool.call("HGETALL", batch_keys.key(str(bid), batch_keys.FAILINFO),
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
    old = client.pool.call("HGET", keys.key(wid, "steps"), name, idempotent=True)
    try:
        record = json.loads(old) if old else {}
    except ValueError:
        record = {}
    record = {**(record if isinstance(record, dict) else {}), **fields}
    client.pool.call("HSET", keys.key(wid, "steps"), name, dumps(record), idempotent=True)


def _end(client: Client, wid: str, flow: dict[str, Any], name: str, outcome: str, *,
         error: dict[str, Any] | None) -> None:
    steps = flow["steps"]
    after = successors(steps)[name]
    client.pool.run(lambda c: keys.END.run(c, [], [wid, name, outcome, flow["policy"], *after]),
                    idempotent=True)
    # The first end stands: a dead job retried by hand from the morgue later moves nothing.
    recorded = client.pool.call("HGET", keys.key(wid, "ends"), name, idempotent=True)
    if text(recorded or "") != outcome:
        log.warning("workflow.late_end", wid=wid, step=name, outcome=outcome,
                    recorded=text(recorded or ""))
        return
    _record(client, wid, name, state="succeeded" if outcome == "success" else "failed",
            error=error, ended_at=time.time())
    if outcome == "success":
        owners = client.pool.call("HGETALL", keys.key(wid, "owner"), idempotent=True)
        owned = {k for k, v in pairs(owners) if v == name}
        stopped = client.pool.call("HGET", keys.key(wid), "stopped_by", idempotent=True)
        for nxt in after:
            if nxt in owned and not stopped:
                _launch(client, wid, flow, nxt)
    _maybe_finish(client, wid, flow)


def _launch(client: Client, wid: str, flow: dict[str, Any], name: str) -> None:
    """Launch step ``name``: its batch, its jobs counted and written, in one script,
    once (the ``launched`` guard); a rerun after a SIGKILL writes nothing twice."""
    ends = client.pool.call("HEXISTS", keys.key(wid, "ends"), name, idempotent=True)
    if ends:
        return
    first, error = (inputs(client, wid, flow, name) if flow["steps"][name]["results"]
                    else (None, None))
    if error is not None:
        _end(client, wid, flow, name, "death", error=error)
        return
    jids = step_jids(client, wid, name, len(flow["steps"][name]["args"]))
    args, record = _step(client, wid, flow, name, first, jids=jids, ttl=_ttl(client, wid))
    client.pool.call("HSET", keys.key(wid, "steps"), name, record, idempotent=True)
    _at("launch")
    try:
        run(client.pool, LAUNCH, args)
    except BatchError as exc:
        if "already exists" not in str(exc):
            raise
        # Launched by an earlier wurk, which held a step with a hold of its own (no guard).
        log.warning("workflow.launched_before", wid=wid, step=name)
        run(client.pool, REMOVE, [args[3], LEGACY_STEP_HOLD])
    finally:
        _at("launched")


def _step(client: Client, wid: str, flow: dict[str, Any], name: str, first: Any, *,
          jids: list[str], ttl: int) -> tuple[list[Any], str]:
    """The ``batch_launch`` arguments of step ``name`` and its status record."""
    steps = flow["steps"]
    body = steps[name]
    bid = f"{wid}.{list(steps).index(name)}"
    step_batch = Batch(f"workflow {wid} step {name}", parent=wid, client=client,
                       on_success=(keys.ADVANCE, [wid, name, "success"]),
                       on_death=(keys.ADVANCE, [wid, name, "death"]),
                       callback_queue=flow["queue"], workflow={"wid": wid, "step": name},
                       expires_in=ttl, _fixed=(bid, ""), _write=False)
    entry = registry.find(body["job"])
    fields = entry.options.payload_fields() if entry else {"queue": "default"}
    passed = keep_for_successors(flow, name, fields, ttl)
    jobs = []
    for jid, args in zip(jids, body["args"], strict=True):
        full = [first, *args] if body["results"] else list(args)
        # Through the client middleware as a push; one that stops a job leaves it out,
        # one that defers it pushes it later as a job of this batch.
        got = client.prepared({**fields, "class": body["job"], "args": full, "jid": jid,
                               batch_keys.FIELD: bid})
        if isinstance(got, tuple):
            jobs.append(got)
    record = dumps({"state": "running", "bid": bid, "jobs": len(jids),
                    **({PASSED: True} if passed else {})})
    return _launch_args(wid, ttl, name, step_batch, jobs), record


def _launch_args(wid: str, ttl: int, field: str, batch: Batch,
                 jobs: list[Prepared]) -> list[Any]:
    """ARGV of Lua ``batch_launch``: guard, the batch's creation, its jids, the write."""
    tail, _ = write_tail(as_push(jobs))
    made = batch.create_args
    return [keys.key(wid, "launched"), field, ttl, *made[:5], (len(made) - 5) // 2, *made[5:],
            len(jobs), *(str(p["jid"]) for p, _ in jobs), *tail]


def _linger(client: Client, wid: str) -> int:
    """The root batch's linger (the ``batch_linger`` of the process that started it)."""
    raw = text(client.pool.call("HGET", batch_keys.key(wid), batch_keys.LINGER_FIELD,
                                idempotent=True) or "")
    ok = raw.isdigit() and len(raw) <= 8 and int(raw) > 0
    return min(int(raw), int(batch_keys.MAX_EXPIRY)) if ok else keys.LINGER


def _ttl(client: Client, wid: str) -> int:
    """The root's remaining lifetime: a step's batch and guard live no longer."""
    left = client.pool.call("TTL", batch_keys.key(wid), idempotent=True)
    return int(left) if isinstance(left, int) and left > 0 else int(batch_keys.EXPIRY)


def _atomically(client: Client, commands: list[tuple[Any, ...]]) -> None:
    """One MULTI/EXEC of guarded (so replayable) commands; a refusal raises."""
    replies = client.pool.run(lambda c: c.pipeline(commands, transaction=True),
                              idempotent=True)
    for reply in replies or []:
        if isinstance(reply, rx.ResponseError):
            raise refusal(reply)


# A test's hook, called at named points of a launch ("start", "started",
# "launch", "launched") to stop the process exactly there.
_hook: Callable[[str], None] | None = None


def _at(point: str) -> None:
    if _hook is not None:
        _hook(point)


def _maybe_finish(client: Client, wid: str, flow: dict[str, Any]) -> None:
    """When every step is resolved, write the final state once and let the root go."""
    ends = dict(pairs(client.pool.call("HGETALL", keys.key(wid, "ends"), idempotent=True)))
    records = dict(pairs(client.pool.call("HGETALL", keys.key(wid, "steps"), idempotent=True)))
    stopped = client.pool.call("HGET", keys.key(wid), "stopped_by", idempotent=True)
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
    # The state before finished_at: a reader that sees the workflow finished sees
    # how it ended. Written by every call, not only the first: the state follows
    # from the ends, so a rerun after a crash between the two still records both.
    client.pool.call("HSET", keys.key(wid), "state", state, idempotent=True)
    first = client.pool.call("HSETNX", keys.key(wid), "finished_at", f"{time.time():.6f}",
                             idempotent=True)
    linger = _linger(client, wid)
    for name in keys.all_keys(wid):
        client.pool.call("EXPIRE", name, linger, idempotent=True)
    # After the EXPIREs: a drain that finds the hash still there looks again later.
    client.pool.call("ZADD", keys.RETIRE, f"{time.time() + linger:.0f}", wid, idempotent=True)
    drop_passed_results(client, wid, records)
    if first:
        log.info("workflow.finished", wid=wid, state=state, failed=sorted(
            n for n, v in ends.items() if v == "death"), skipped=sorted(blocked))
    run(client.pool, REMOVE, [wid, keys.ROOT_HOLD])


"""Results passed between workflow steps: the jids, the inputs, their lifetime.

Duties:
1. :func:`step_jids`: the jids of a step's jobs, chosen once (``HSETNX``) before
   the first push, so a replayed launch reuses them.
2. :func:`inputs`: the first argument of a step that takes results, or the
   error that fails it (a result expired, never stored, or an error).
3. :func:`keep_for_successors` / :func:`drop_passed_results`: the
   ``result_ttl`` of a step whose result a later step reads (at most the
   workflow's remaining lifetime), and deleting those results when the
   workflow ends (nothing reads them then), unless the job asked for them.
"""

from __future__ import annotations

import json
from typing import Any

from wurk.core.validate import is_whole
from wurk.push.client import Client
from wurk.results import records as results_wire
from wurk.wire.payload import dumps, new_jid
from wurk.workflows import keys
from wurk.workflows.spec import WorkflowError, successors

PASSED = "passes_results"  # in a step's record: its results are stored only for its successors

def step_jids(client: Client, wid: str, name: str, count: int) -> list[str]:
    fresh = dumps([new_jid() for _ in range(count)])
    client.pool.call("HSETNX", keys.key(wid, "jids"), name, fresh, idempotent=True)
    stored = client.pool.call("HGET", keys.key(wid, "jids"), name, idempotent=True)
    jids = json.loads(stored)
    if not isinstance(jids, list) or len(jids) != count:
        raise WorkflowError(f"workflow {wid}: the stored jids of step {name!r} are unusable")
    return [str(j) for j in jids]


def inputs(client: Client, wid: str, flow: dict[str, Any],
            name: str) -> tuple[Any, dict[str, Any] | None]:
    """The first argument of a results step, or the error that fails it."""
    values: dict[str, Any] = {}
    for before in flow["steps"][name]["after"]:
        jids = step_jids(client, wid, before, len(flow["steps"][before]["args"]))
        got: list[Any] = []
        for start in range(0, len(jids), 1000):
            part = jids[start:start + 1000]
            raws = client.pool.call("MGET", *[results_wire.key(j) for j in part],
                                    idempotent=True)
            for jid, raw in zip(part, raws, strict=True):
                problem = missing(before, jid, raw)
                if problem:
                    return None, {"jid": jid, "class": "wurk.MissingResult", "message": problem}
                got.append(results_wire.parse(jid, raw).value)
        values[before] = got[0] if len(flow["steps"][before]["args"]) == 1 else got
    after = flow["steps"][name]["after"]
    return (values[after[0]] if len(after) == 1 else values), None


def missing(step: str, jid: str, raw: Any) -> str | None:
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


def feeds_results(steps: dict[str, Any], name: str) -> bool:
    """Whether a step after ``name`` takes its result as input."""
    return any(steps[n]["results"] for n in successors(steps)[name])


def positive_int(value: Any, default: int) -> int:
    return value if is_whole(value) and value > 0 else default


def keep_for_successors(flow: dict[str, Any], name: str, fields: dict[str, Any],
                        ttl: int) -> bool:
    """Give step ``name``'s payload ``fields`` the ``result_ttl`` its successors need.

    Kept while a later step may read it, so no longer than the workflow's
    remaining lifetime ``ttl``; a job that asked for results keeps its own TTL
    if longer. True when the result is stored only for the successors: the
    step's record says so (PASSED) and the results go when the workflow ends.
    """
    if not feeds_results(flow["steps"], name):
        return False
    needed = min(positive_int(flow.get("result_ttl"), results_wire.DEFAULT_TTL), max(ttl, 1))
    own = fields.get(results_wire.TTL)
    if is_whole(own):
        fields[results_wire.TTL] = max(needed, own)
        return False
    fields[results_wire.TTL] = needed
    return True


def drop_passed_results(client: Client, wid: str, records: dict[str, Any]) -> None:
    """Delete the results stored only so that a later step could read them.

    ``records`` are the steps' status records; every step has ended, so
    nothing reads these results again.
    """
    for name, raw in records.items():
        try:
            record = json.loads(raw)
        except (TypeError, ValueError):
            continue  # unreadable: the results expire by their own TTL
        if not isinstance(record, dict) or record.get(PASSED) is not True:
            continue
        stored = client.pool.call("HGET", keys.key(wid, "jids"), name, idempotent=True)
        try:
            jids = [str(j) for j in json.loads(stored)] if stored else []
        except (TypeError, ValueError):
            continue
        for start in range(0, len(jids), 500):
            part = jids[start:start + 500]
            client.pool.call("DEL", *[results_wire.key(j) for j in part],
                             *[results_wire.ready_key(j) for j in part], idempotent=True)

"""Workflows, the definition: steps, ``>>`` composition, the dict form, validation.

A workflow is a DAG of steps. A step is one job (``wurk.step(job, *args)``)
or a group of calls of one job run in parallel (``wurk.group(job, [[1],
[2]])``, one batch for all of them). Steps compose with ``>>``: ``a >> b``
runs b after a succeeded, ``a >> [b, c] >> d`` is a diamond, ``[b, c] >> d``
a chord. The same DAG can be written as a dict (the form stored in Redis):
``{"steps": {"fetch": {"job": "fetch", "args": [[url]]}, "merge": {"job":
"merge", "args": [[]], "after": ["fetch"], "results": true}}}``.

Duties:
1. :class:`Step` and :class:`Flow`: build the DAG with ``>>``, naming steps
   by their job (``parse``, ``parse#2``...) unless given a name.
2. :func:`definition`: a Flow, a Step or a dict as the stored definition.
3. :func:`validate`: refuse anything wrong before the first write: not a
   dict of steps, a bad name, an unknown job, arguments that are not JSON or
   do not fit the job, an ``after`` naming no step, a cycle.
4. :func:`successors`/:func:`order`: what the advance job and the status read.
5. :func:`load`: a stored definition read back from Redis, checked for shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from wurk.batches import keys as batch_keys
from wurk.core.validate import is_text
from wurk.push import signatures
from wurk.push.client import Client
from wurk.push.job import Enqueuer, Job, registry
from wurk.wire.payload import ArgumentError, check_args

__all__ = ["Flow", "Step", "WorkflowError", "definition", "group", "step", "validate"]

MAX_STEPS = 10_000
MAX_CALLS = 100_000  # jobs in one workflow, groups included
MAX_NAME = 200
POLICIES = ("stop", "continue")


class WorkflowError(ValueError):
    """A workflow definition is wrong (nothing was pushed), or a workflow cannot be found."""


def _job_name(job: Any) -> str:
    if isinstance(job, type) and issubclass(job, Job):
        job = job.enqueuer()
    if isinstance(job, Enqueuer):
        return job.name
    if isinstance(job, str):
        return job
    raise WorkflowError(f"a step's job must be a @wurk.job function, a wurk.Job class or a "
                        f"registered name, got {job!r}")


class Step:
    """One node of a workflow: ``calls`` are the argument lists of its job(s)."""

    def __init__(self, job: Any, calls: Sequence[Sequence[Any]], *, name: str | None = None,
                 results: bool = False) -> None:
        self.job = _job_name(job)
        self.calls = [list(call) for call in calls]
        self.name = name
        self.results = results

    def __rshift__(self, other: Any) -> Flow:
        return Flow.of(self).then(other)

    def __rrshift__(self, other: Any) -> Flow:  # [b, c] >> d
        return Flow.of(other).then(self)

    def __repr__(self) -> str:
        return f"<wurk.step {self.name or self.job} x{len(self.calls)}>"


def step(job: Any, *args: Any, name: str | None = None, results: bool = False) -> Step:
    """A step running ``job(*args)``; ``results=True`` passes the results of the
    steps before it as the first argument."""
    return Step(job, [list(args)], name=name, results=results)


def group(job: Any, calls: Sequence[Sequence[Any]], *, name: str | None = None,
          results: bool = False) -> Step:
    """A step running ``job(*call)`` for every call, in parallel (one batch)."""
    if isinstance(calls, str | bytes) or not isinstance(calls, Sequence) or not calls:
        raise WorkflowError(f"a group takes a non-empty list of argument lists, got {calls!r}")
    for call in calls:
        if isinstance(call, str | bytes) or not isinstance(call, Sequence):
            raise WorkflowError(f"each call of a group is a list of arguments, got {call!r}")
    return Step(job, calls, name=name, results=results)


class Flow:
    """Steps and the edges between them; ``heads`` start it, ``tails`` end it."""

    def __init__(self, steps: list[Step], edges: list[tuple[Step, Step]], heads: list[Step],
                 tails: list[Step]) -> None:
        self.steps, self.edges, self.heads, self.tails = steps, edges, heads, tails

    @classmethod
    def of(cls, item: Any) -> Flow:
        if isinstance(item, Flow):
            return item
        if isinstance(item, Step):
            return cls([item], [], [item], [item])
        if isinstance(item, list | tuple) and item:
            parts = [cls.of(one) for one in item]
            return cls(_unique([s for p in parts for s in p.steps]),
                       [e for p in parts for e in p.edges],
                       [s for p in parts for s in p.heads], [s for p in parts for s in p.tails])
        raise WorkflowError(f"a workflow is made of wurk.step()/wurk.group() steps, lists of "
                            f"them and >>, got {item!r}")

    def __rshift__(self, other: Any) -> Flow:
        return self.then(other)

    def then(self, other: Any) -> Flow:
        """``self >> other``."""
        right = Flow.of(other)
        edges = [(a, b) for a in self.tails for b in right.heads]
        return Flow(_unique(self.steps + right.steps), self.edges + right.edges + edges,
                    self.heads, right.tails)

    def __rrshift__(self, other: Any) -> Flow:
        return Flow.of(other).then(self)


def _unique(steps: list[Step]) -> list[Step]:
    seen: dict[int, Step] = {}
    for one in steps:
        seen.setdefault(id(one), one)
    return list(seen.values())


def _from_flow(flow: Flow) -> dict[str, Any]:
    names: dict[int, str] = {}
    taken: set[str] = {s.name for s in flow.steps if s.name}
    counts: dict[str, int] = {}
    for one in flow.steps:
        if one.name:
            names[id(one)] = one.name
            continue
        base = one.job
        while True:
            counts[base] = counts.get(base, 0) + 1
            name = base if counts[base] == 1 else f"{base}#{counts[base]}"
            if name not in taken:
                break
        taken.add(name)
        names[id(one)] = name
    steps: dict[str, Any] = {}
    for one in flow.steps:
        after = [names[id(a)] for a, b in flow.edges if b is one]
        steps[names[id(one)]] = {"job": one.job, "args": one.calls,
                                 "after": list(dict.fromkeys(after)), "results": one.results}
    return {"steps": steps}


def definition(spec: Any) -> dict[str, Any]:
    """The dict form of a Flow, a Step, a list of steps or a dict (copied), not yet checked."""
    if isinstance(spec, Mapping):
        return {"steps": dict(spec["steps"])} if "steps" in spec else {"steps": dict(spec)}
    return _from_flow(Flow.of(spec))


def validate(spec: dict[str, Any], *, check_jobs: bool = True) -> dict[str, dict[str, Any]]:
    """The steps of ``spec``, each checked and normalised; WorkflowError for the first fault.

    ``check_jobs=False`` (a definition read back from Redis by a worker that
    may not know every job) checks the shape only."""
    raw = spec.get("steps")
    if not isinstance(raw, Mapping) or not raw:
        raise WorkflowError("a workflow needs a non-empty dict of steps")
    if len(raw) > MAX_STEPS:
        raise WorkflowError(f"a workflow has at most {MAX_STEPS} steps, got {len(raw)}")
    steps = {name: _check_step(name, body, check_jobs) for name, body in raw.items()}
    if sum(len(s["args"]) for s in steps.values()) > MAX_CALLS:
        raise WorkflowError(f"a workflow runs at most {MAX_CALLS} jobs")
    for name, body in steps.items():
        for before in body["after"]:
            if before not in steps:
                raise WorkflowError(f"step {name!r} runs after {before!r}, which is no step")
    order(steps)  # raises on a cycle
    return steps


def _check_step(name: Any, body: Any, check_jobs: bool) -> dict[str, Any]:
    _check_shape(name, body)
    job, calls, results, after = (body.get("job"), body.get("args", [[]]),
                                  body.get("results", False), body.get("after", []))
    if not isinstance(job, str) or (check_jobs and registry.find(job) is None):
        raise WorkflowError(f"step {name!r}: unknown job {job!r} (not registered in this "
                            "process: define it with @wurk.job or wurk.Job)")
    if not isinstance(calls, list) or not calls or not all(isinstance(c, list) for c in calls):
        raise WorkflowError(f"step {name!r}: 'args' is a non-empty list of argument lists")
    if not isinstance(results, bool):
        raise WorkflowError(f"step {name!r}: 'results' is true or false, got {results!r}")
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise WorkflowError(f"step {name!r}: 'after' is a list of step names")
    if results and not after:
        raise WorkflowError(f"step {name!r} asks for results but runs after no step")
    _check_calls(name, job, calls, results=results, check_jobs=check_jobs)
    return {"job": job, "args": calls, "after": list(dict.fromkeys(after)), "results": results}


def _check_shape(name: Any, body: Any) -> None:
    if not is_text(name, MAX_NAME) or not name.isprintable():
        raise WorkflowError(f"a step name is 1 to {MAX_NAME} printable characters, got {name!r}")
    if not isinstance(body, Mapping):
        raise WorkflowError(f"step {name!r} must be a dict with 'job', got {body!r}")
    unknown = set(body) - {"job", "args", "after", "results"}
    if unknown:
        raise WorkflowError(f"step {name!r} has unknown keys {sorted(unknown)}")


def _check_calls(name: str, job: str, calls: list[list[Any]], *, results: bool,
                 check_jobs: bool) -> None:
    for call in calls:
        try:
            check_args(call, f"step {name!r} arguments")
            if check_jobs:
                signatures.check(job, [None, *call] if results else call,
                                 f" in step {name!r}", placeholders=1 if results else 0)
        except ArgumentError as exc:
            raise WorkflowError(str(exc)) from None


def successors(steps: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {name: [] for name in steps}
    for name, body in steps.items():
        for before in body["after"]:
            out[before].append(name)
    return out


def order(steps: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The steps in an order where each comes after those it waits for; raises on a cycle."""
    waiting = {name: len(body["after"]) for name, body in steps.items()}
    after = successors(steps)
    ready = [name for name, count in waiting.items() if count == 0]
    done: list[str] = []
    while ready:
        name = ready.pop()
        done.append(name)
        for nxt in after[name]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(done) < len(steps):
        stuck = sorted(name for name in steps if name not in done)
        raise WorkflowError(f"the workflow has a cycle through steps {stuck[:10]}")
    return done


def load(client: Client, wid: str) -> dict[str, Any]:
    """The stored definition of ``wid``, checked for shape (not for registered jobs)."""
    raw = client.pool.call("HGET", batch_keys.key(wid), "workflow", idempotent=True)
    if raw is None:
        raise WorkflowError(f"workflow {wid} does not exist (expired or never made)")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("policy") not in POLICIES:
            raise WorkflowError("not a workflow definition")
        data["steps"] = validate(data, check_jobs=False)
    except (ValueError, TypeError, KeyError) as exc:
        raise WorkflowError(f"workflow {wid}: its stored definition is unusable: {exc}") from None
    return data


def pairs(raw: Any) -> list[tuple[str, str]]:
    if isinstance(raw, dict):
        return [(text(k), text(v)) for k, v in raw.items()]
    items = list(raw or [])
    return [(text(items[i]), text(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

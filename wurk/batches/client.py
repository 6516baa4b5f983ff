"""Batches: a set of jobs tracked by atomic counters, with callback jobs.

``with wurk.Batch("import 42", on_success=(notify, [42])) as b: b.add(row, 1)``
makes the batch record (``b-<bid>``, held open by this builder), pushes
each job with the batch's id in its payload (``bid``; the client's built-in
step counts it first, :mod:`wurk.batches.push`), and on leaving the
block lets the batch go: once its jobs have run, the worker's Lua fires the
callbacks (:mod:`wurk.batches.lua`). Without ``with``: ``b = Batch(...)``,
``b.add(...)``, ``b.commit()``.

Duties:
1. Check everything before writing anything: callbacks (a registered job,
   or its name, with JSON arguments), description, workflow data (JSON),
   ``expires_in``; build each callback's payload template, with the status
   slot the Lua fills at firing time.
2. Create the record with a hold, linked to its parent batch: the one given,
   else the batch being built in this context or the batch of the job now
   running (nested batches count in their parent).
3. ``add``/``add_bulk``/``push``: push jobs of the batch through the client.
4. ``commit``: drop this builder's hold, so the batch may complete. A block
   that made the batch and is left by an exception records ``aborted`` and
   keeps its hold: the jobs already pushed run, the callbacks never fire,
   and the status shows why. A reopened batch's block just lets go.
5. ``current``/``reopen``: the batch of the running job (set by the worker,
   :mod:`wurk.batches.step`) or any batch by id, to add jobs to it; a job
   of a batch that adds jobs keeps the batch open until they finish.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from wurk.batches import keys
from wurk.batches.lua import ABORT, CREATE, HOLD, REMOVE
from wurk.batches.push import STRICT, BatchError, run
from wurk.core.validate import is_number
from wurk.push import signatures
from wurk.push.client import Client
from wurk.push.job import Enqueuer, Job, registry
from wurk.push.options import JobOptions
from wurk.wire.payload import check_args, dumps, new_jid, now_stamp

__all__ = ["RUNNING", "Batch", "BatchError"]

# The bid of the batch job running in this context, set by the worker.
RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("wurk_batch_running",
                                                                    default=None)
_BUILDING: contextvars.ContextVar[tuple[Batch, ...]] = contextvars.ContextVar(
    "wurk_batch_building", default=())
_CURRENT: Any = object()  # parent=: the batch of this context


def _job_of(job: Any) -> tuple[str, JobOptions]:
    """The wire name and options of a job given as its function, class, enqueuer or name."""
    if isinstance(job, type) and issubclass(job, Job):
        job = job.enqueuer()
    if isinstance(job, Enqueuer):
        return job.name, job.options
    if isinstance(job, str):
        entry = registry.find(job)
        if entry is None:
            raise BatchError(f"unknown job {job!r}: not registered in this process "
                             "(define it with @wurk.job or wurk.Job, or pass the job itself)")
        return job, entry.options
    raise BatchError(f"a batch job or callback must be a @wurk.job function, a wurk.Job "
                     f"class or a registered name, got {job!r}")


def _specs(event: str, value: Any) -> list[tuple[str, JobOptions, list[Any]]]:
    """``on_<event>=``: a job, ``(job, args)``, or a list of those."""
    if value is None:
        return []
    many = value if isinstance(value, list) else [value]
    specs = []
    args: Any
    for one in many:
        job, args = one, []
        if isinstance(one, tuple):
            if not 1 <= len(one) <= 2 or not isinstance(one[-1] if len(one) == 2 else [],
                                                         list | tuple):
                raise BatchError(f"on_{event} takes a job or (job, [args]), got {one!r}")
            job, args = one[0], (one[1] if len(one) == 2 else [])
        name, options = _job_of(job)
        check_args(list(args), f"on_{event} arguments")
        specs.append((name, options, list(args)))
    return specs


class Batch:
    """A batch of jobs; see the module docstring and docs/how-to/batches.md."""

    def __init__(self, description: str | None = None, *, on_complete: Any = None,
                 on_success: Any = None, on_death: Any = None, parent: Any = _CURRENT,
                 callback_queue: str | None = None, workflow: Any = None,
                 expires_in: float = keys.EXPIRY, client: Client | None = None,
                 _fixed: tuple[str, str] | None = None, _write: bool = True) -> None:
        self.client = client or Client.default()
        if description is not None and not isinstance(description, str):
            raise BatchError(f"description must be a str, got {type(description).__name__}")
        if callback_queue is not None and (not isinstance(callback_queue, str)
                                           or not callback_queue):
            raise BatchError(f"callback_queue must be a non-empty str, got {callback_queue!r}")
        if not is_number(expires_in) or not 1 <= expires_in <= keys.MAX_EXPIRY \
                or math.isnan(expires_in):
            raise BatchError(f"expires_in must be 1 to {keys.MAX_EXPIRY} seconds, "
                             f"got {expires_in!r}")
        self.parent_bid = _parent_bid(parent)
        # _fixed (bid, hold): wurk.workflows.client's replayable creation (CREATE is then a
        # replay); with _write False nothing is written: the workflow launches it in one
        # script (Lua batch_launch) from create_args.
        self.bid = _fixed[0] if _fixed else keys.new_bid()  # as Sidekiq Pro makes one
        self.description = description
        fields: dict[str, str] = {"description": description or "", "expires_in":
                                  str(int(expires_in)),
                                  keys.LINGER_FIELD: str(self.client.config.batch_linger)}
        if workflow is not None:
            try:
                fields["workflow"] = dumps(workflow)
            except (TypeError, ValueError) as exc:
                raise BatchError(f"workflow data must be JSON: {exc}") from None
        self._set_callbacks(fields, callback_queue, on_complete=on_complete,
                            on_success=on_success, on_death=on_death)
        self._hold: str | None = ((_fixed[1] or None) if _fixed
                                  else keys.HOLD_PREFIX + secrets.token_hex(8))
        # [bid, parent, hold, expires_in, prune score, field, value, ...]: Lua batch_create's
        # ARGV, also what wurk.workflows.client's one-script launch creates the batch with.
        self.create_args: list[Any] = [self.bid, self.parent_bid or "", self._hold or "",
                                       int(expires_in), _prune_before()]
        for name, value in fields.items():
            self.create_args += [name, value]
        if _write:
            run(self.client.pool, CREATE, self.create_args)
        self._created = True
        self._token: contextvars.Token[tuple[Batch, ...]] | None = None

    def _set_callbacks(self, fields: dict[str, str], queue: str | None, **events: Any) -> None:
        shown: dict[str, list[dict[str, Any]]] = {}
        templates: dict[str, list[list[str]]] = {}
        fmt = self.client.config.timestamps
        for key, value in events.items():
            event = key.removeprefix("on_")
            for name, options, args in _specs(event, value):
                where = queue or options.queue
                shown.setdefault(event, []).append({"job": name, "queue": where, "args": args})
                templates.setdefault(event, []).append(
                    _template(name, options, args, where, parent=self.parent_bid, fmt=fmt))
        fields["callbacks"] = dumps(shown)
        fields["cbt"] = dumps(templates)

    # -- other ways to get a batch --------------------------------------------
    @classmethod
    def _existing(cls, bid: str, client: Client | None) -> Batch:
        made = cls.__new__(cls)
        made.client = client or Client.default()
        made.bid, made.parent_bid, made.description = bid, None, None
        made._hold, made._token, made._created = None, None, False
        return made

    @classmethod
    def reopen(cls, bid: str, *, client: Client | None = None) -> Batch:
        """The batch ``bid``, to add jobs to; raises BatchError if it does not exist."""
        if not keys.valid_bid(bid):
            raise BatchError(f"a bid is a string of 1 to {keys.MAX_BID} characters, got {bid!r}")
        made = cls._existing(bid, client)
        fields = made.client.pool.run(
            lambda c: c.call("HMGET", keys.key(bid), "created_at", "parent_bid", "description"),
            idempotent=True)
        if fields[0] is None:
            raise BatchError(f"batch {bid} does not exist (expired or never made)")
        made.parent_bid = _text(fields[1]) or None
        made.description = _text(fields[2]) or None
        return made

    @classmethod
    def current(cls) -> Batch | None:
        """The batch being built in this context, else the running job's batch, else None."""
        building = _BUILDING.get()
        if building:
            return building[-1]
        bid = RUNNING.get()
        return cls._existing(bid, None) if bid else None

    # -- adding jobs --------------------------------------------------------------
    def add(self, job: Any, *args: Any) -> str | None:
        """Push ``job(*args)`` as a job of this batch; its jid (None if a middleware stopped it)."""
        name, options = _job_of(job)
        signatures.check(name, args)
        return self.push({**options.payload_fields(), "class": name, "args": list(args)})

    def add_bulk(self, job: Any, args: Iterable[Sequence[Any]]) -> list[str]:
        """Push one job of this batch per argument list (a thousand per round trip)."""
        name, options = _job_of(job)
        token = STRICT.set(True)
        try:
            return self.client.push_bulk({**options.payload_fields(), "class": name,
                                          "args": [list(one) for one in args],
                                          keys.FIELD: self.bid})
        finally:
            STRICT.reset(token)

    def push(self, item: Mapping[str, Any]) -> str | None:
        """Push a raw item (as ``Client.push`` takes it) as a job of this batch."""
        token = STRICT.set(True)
        try:
            return self.client.push({**item, keys.FIELD: self.bid})
        finally:
            STRICT.reset(token)

    # -- letting it go ------------------------------------------------------------
    def commit(self) -> None:
        """Drop this builder's hold: the batch completes once its jobs have run."""
        if self._hold is not None:
            run(self.client.pool, REMOVE, [self.bid, self._hold])
            self._hold = None

    def __enter__(self) -> Batch:
        if self._hold is None:
            self._hold = keys.HOLD_PREFIX + secrets.token_hex(8)
            run(self.client.pool, HOLD, [self.bid, self._hold])
        self._token = _BUILDING.set((*_BUILDING.get(), self))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._token is not None:
            _BUILDING.reset(self._token)
            self._token = None
        if exc is None or not self._created:
            # A reopened batch was whole before this block: what it added joins it.
            self.commit()
            return
        # The jobs pushed so far run; the batch is not the whole of what was meant.
        with contextlib.suppress(Exception):  # the block's own error is what the caller sees
            run(self.client.pool, ABORT, [self.bid, f"{type(exc).__name__}: {exc}"[:1000]])

    def __repr__(self) -> str:
        return f"<wurk.Batch {self.bid} {self.description or ''!r}>"


def _parent_bid(parent: Any) -> str | None:
    if parent is _CURRENT:
        current = Batch.current()
        return current.bid if current else None
    if parent is None:
        return None
    bid = parent.bid if isinstance(parent, Batch) else parent
    if not keys.valid_bid(bid):
        raise BatchError(f"parent must be a Batch, a bid or None, got {parent!r}")
    return str(bid)


def _template(name: str, options: JobOptions, args: list[Any], queue: str, *,
              parent: str | None, fmt: str) -> list[str]:
    """[queue, head, tail, jid, parent, ts]: the Lua writes head + status + tail."""
    mark = f"wurk-batch-status-{secrets.token_hex(8)}"
    payload = {**options.payload_fields(), "class": name, "queue": queue,
               "args": [mark, *args], "jid": new_jid(), "created_at": now_stamp(fmt)}
    for unused in ("unique_for", "unique_until"):  # callbacks are pushed by Lua, lock-free
        payload.pop(unused, None)
    if parent:
        payload[keys.FIELD] = parent  # counted in the parent while it runs
    text = dumps(payload)
    head, _, tail = text.partition(dumps(mark))
    return [queue, head, tail, payload["jid"], parent or "", fmt]


def _prune_before() -> str:
    """Index entries older than this cannot have a record any more."""
    return f"{time.time() - keys.MAX_EXPIRY:.6f}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")

"""Batches as an operator reads them (Sidekiq Pro's ``Batch::Status`` and ``BatchSet``).

Duties:
1. :class:`BatchStatus`: one batch read in one round trip: counts,
   failures with their jids and errors (the first FAILURE_PAGE of them),
   the jids still pending (a page: the jobs the batch waits on, such as
   one whose write's outcome was unknown), dead jids, children, parent,
   callbacks and when each fired, workflow data, and a ``state``:
   building (a builder still holds it), running,
   complete, success, aborted (its builder's block raised), or abandoned
   (unfinished and no progress for ``abandoned_after`` seconds).
2. :class:`BatchSet`: the ``batches`` index, newest first; a bid whose
   record expired is skipped.
3. :meth:`BatchSet.forget`: an operator's way out for a job counted into
   a batch but never written (a buffered push dropped after its count, a
   give-back that failed): uncount it, so the batch can finish.
4. Read everything from Redis as untrusted: a key of the wrong type or a
   field that is not a number is reported in ``problems``, never raised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from wurk.batches import keys
from wurk.batches.lua import REMOVE
from wurk.redis.runtime import runtime_for
from wurk.settings.config import Config
from wurk.wire.replies import hash_items, resolve, text, to_float, to_int

FAILURE_PAGE = 100


@dataclass(frozen=True)
class BatchStatus:
    bid: str
    exists: bool
    description: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    total: int = 0
    pending: int = 0
    failures: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)  # jid, class, message
    dead_jids: list[str] = field(default_factory=list)
    pending_jids: list[str] = field(default_factory=list)  # a page of them, holds left out
    dead: int = 0
    parent_bid: str | None = None
    children: list[str] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)
    fired: dict[str, float | None] = field(default_factory=dict)
    workflow: Any = None
    aborted: str | None = None
    holds: int = 0
    ttl: int = -2
    state: str = "missing"
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.fired.get("complete") is not None

    @property
    def success(self) -> bool:
        return self.fired.get("success") is not None

    @classmethod
    def read(cls, bid: str, *, config: Config | None = None) -> BatchStatus:
        """The status of ``bid`` now (``exists`` False when it has no record)."""
        return BatchSet(config=config).get(bid)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class BatchSet:
    def __init__(self, *, config: Config | None = None,
                 abandoned_after: float = keys.ABANDONED_AFTER) -> None:
        self.config = resolve(config)
        self.runtime = runtime_for(self.config)
        self.abandoned_after = abandoned_after

    def size(self) -> int:
        """Entries in the index (some may have expired since)."""
        return int(self.runtime.pool.call("ZCARD", keys.INDEX, idempotent=True) or 0)

    def bids(self, limit: int = 100, offset: int = 0) -> list[str]:
        found = self.runtime.pool.call("ZREVRANGE", keys.INDEX, offset,
                                           offset + max(1, limit) - 1, idempotent=True)
        return [text(bid) for bid in found or []]

    def list(self, limit: int = 100, offset: int = 0) -> list[BatchStatus]:
        """The newest batches still in Redis, newest first."""
        statuses = (self.get(bid) for bid in self.bids(limit, offset))
        return [status for status in statuses if status.exists]

    def __iter__(self) -> Iterator[BatchStatus]:
        offset = 0
        while page := self.bids(100, offset):
            for bid in page:
                status = self.get(bid)
                if status.exists:
                    yield status
            offset += len(page)

    def forget(self, bid: str, jids: Sequence[str]) -> int:
        """Uncount ``jids`` from batch ``bid`` (Lua ``batch_remove``, which then
        settles it: its callbacks may fire now); how many were pending. Only for
        jobs that are nowhere in Redis: one that still runs later is not counted."""
        if not keys.valid_bid(bid):
            raise ValueError(f"a bid is a string of 1 to {keys.MAX_BID} characters, got {bid!r}")
        bad = [j for j in jids if not isinstance(j, str) or not j
               or j.startswith(keys.HOLD_PREFIX)]
        if bad or not jids:
            raise ValueError(f"give the jids to forget (a builder's hold is not one): {bad!r}")
        return int(self.runtime.pool.run(lambda c: REMOVE.run(c, [], [bid, *jids]),
                                             idempotent=True))

    def get(self, bid: str) -> BatchStatus:
        """The status of ``bid`` (``exists`` False when it has no record)."""
        if not keys.valid_bid(bid):
            raise ValueError(f"a bid is a string of 1 to {keys.MAX_BID} characters, got {bid!r}")
        commands = [("HGETALL", keys.key(bid)), ("SCARD", keys.key(bid, keys.PENDING)),
                    ("SCARD", keys.key(bid, keys.FAILED)),
                    ("HSCAN", keys.key(bid, keys.FAILINFO), 0, "COUNT", FAILURE_PAGE),
                    ("SCARD", keys.key(bid, keys.DIED)),
                    ("SSCAN", keys.key(bid, keys.DIED), 0, "COUNT", FAILURE_PAGE),
                    ("SSCAN", keys.key(bid, keys.KIDS), 0, "COUNT", 1000),
                    ("TTL", keys.key(bid)),
                    ("SSCAN", keys.key(bid, keys.PENDING), 0, "COUNT", FAILURE_PAGE)]
        replies = self.runtime.pool.run(
            lambda c: c.pipeline(commands, raise_on_error=False), idempotent=True)
        return _status(bid, replies, time.time(), self.abandoned_after)


def _checked(reply: Any, name: str, problems: list[str]) -> Any:
    if isinstance(reply, Exception):
        problems.append(f"{name}: {reply}")
        return None
    return reply


def _status(bid: str, replies: list[Any], now: float, abandoned_after: float) -> BatchStatus:
    problems: list[str] = []
    got = [_checked(reply, name, problems) for reply, name in zip(
        replies, ("b-<bid>", "-jids", "-failed", "-failinfo", "-died", "-died", "-kids", "ttl",
                              "-jids"),
        strict=True)]
    fields = {text(k): text(v) for k, v in hash_items(got[0] or [])}
    if not fields:
        return BatchStatus(bid, exists=False, problems=problems)
    live, pending = to_int(got[1]), _number(fields, "pending", problems)
    fired = {event: (to_float(fields[f"{event}_at"]) if f"{event}_at" in fields else None)
             for event in keys.EVENTS}
    status = BatchStatus(
        bid, exists=True, description=fields.get("description", ""),
        created_at=to_float(fields.get("created_at")),
        updated_at=to_float(fields.get("updated_at")),
        total=_number(fields, "total", problems), pending=pending, failures=to_int(got[2]),
        failed=_failures(got[3], problems), dead=to_int(got[4]),
        # SSCAN's COUNT is a hint (a small set comes back whole): cut to the page.
        dead_jids=sorted(text(j) for j in _page(got[5]))[:FAILURE_PAGE],
        pending_jids=sorted(j for j in (text(m) for m in _page(got[8]))
                            if not j.startswith(keys.HOLD_PREFIX))[:FAILURE_PAGE],
        parent_bid=fields.get("parent_bid") or None,
        children=sorted(text(k) for k in _page(got[6])),
        callbacks=_json(fields.get("callbacks"), {}, "callbacks", problems),
        fired=fired, workflow=_json(fields.get("workflow"), None, "workflow", problems),
        aborted=fields.get("aborted") or None, holds=max(0, live - pending), ttl=to_int(got[7]),
        problems=problems)
    return _with_state(status, now, abandoned_after)


def _with_state(status: BatchStatus, now: float, abandoned_after: float) -> BatchStatus:
    if status.success:
        state = "success"
    elif status.aborted:
        state = "aborted"
    elif status.complete:
        state = "complete"  # every job ran: what is left waits on retries (or a hand)
    elif status.updated_at and now - status.updated_at > abandoned_after:
        state = "abandoned"
    else:
        state = "building" if status.holds else "running"
    object.__setattr__(status, "state", state)
    return status


def _number(fields: dict[str, str], name: str, problems: list[str]) -> int:
    value = fields.get(name, "0")
    try:
        return int(value)
    except ValueError:
        problems.append(f"b-<bid> {name} is not a number: {value[:40]!r}")
        return 0


def _json(raw: str | None, default: Any, name: str, problems: list[str]) -> Any:
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError:
        problems.append(f"b-<bid> {name} is not JSON")
        return default


def _page(reply: Any) -> list[Any]:
    """The members of one SSCAN/HSCAN page: [cursor, items]."""
    if isinstance(reply, list | tuple) and len(reply) == 2 and isinstance(reply[1], list | dict):
        return list(reply[1].items()) if isinstance(reply[1], dict) else list(reply[1])
    return []


def _failures(reply: Any, problems: list[str]) -> list[dict[str, Any]]:
    items = _page(reply)
    pairs = items if items and isinstance(items[0], tuple) else list(zip(
        items[::2], items[1::2], strict=False))
    failures = []
    for jid, raw in pairs:
        info = _json(text(raw), {}, "failinfo", problems)
        info = info if isinstance(info, dict) else {}
        failures.append({"jid": text(jid), "class": str(info.get("class", "")),
                         "message": str(info.get("message", "")),
                         "retry_count": info.get("retry_count")})
    return sorted(failures, key=lambda f: f["jid"])

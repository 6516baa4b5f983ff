"""Batches on the wire: key names, limits and the read side of a batch record.

The layout follows Sidekiq Pro's as the Ruby ancestor documents it: a batch
is the hash ``b-<bid>`` plus sets named after it, listed in the ``batches``
sorted set, and each job of a batch carries the batch's id in its payload's
``bid`` field. The atomic steps are the Lua scripts of
:mod:`wurk.batches.lua`.

Duties:
1. Name every key of a batch (:func:`key`) and the global index.
2. Hold the limits and times: bid length, expiry, the linger after success,
   the retire-at index that drops a batch from ``batches`` when its keys go,
   and how many entries one script retires.
3. Say whether a payload's ``bid`` is one we act on (:func:`bid_of`):
   a non-empty string of at most MAX_BID characters; anything else read
   from Redis is ignored, never raised.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from wurk.core.validate import is_text

FIELD = "bid"  # the payload field, as Sidekiq Pro writes it
INDEX = "batches"  # sorted set: bid scored by its creation time
# Sorted set: bid scored by when its keys expire (creation + expires_in, then the
# linger once ``success`` fired). Each create drains up to RETIRE_DRAIN entries
# that are due from it and from INDEX, so the index holds the batches whose keys live.
RETIRE = "wurk:batches:retire"
RETIRE_DRAIN = 100
MAX_BID = 64
EVENTS = ("complete", "success", "death")

DAY = 24 * 60 * 60
EXPIRY = 30 * DAY  # an unfinished batch's keys live this long from creation
MAX_EXPIRY = 90 * DAY  # the longest a batch may ask for; the index is pruned past it
LINGER = DAY  # a batch whose success fired is kept this long for the status API
LINGER_FIELD = "linger"  # in the hash: its own linger (the batch_linger setting), seconds
ABANDONED_AFTER = DAY  # no progress for this long: an unfinished batch is shown abandoned
# A fired marker lives as long as its batch's hash, plus this margin, never less:
# a replay that finds no hash fires nothing, so the marker is not needed past it.
MARKER_MARGIN_MS = 60_000
MARKER_TTL = 30 * DAY  # for a hash with no TTL of its own (not one these scripts made)

# The sets of one batch, by suffix of ``b-<bid>-``.
PENDING = "jids"  # jids not yet succeeded (and the builders' holds)
FAILED = "failed"  # jids that failed and have not succeeded since
FAILINFO = "failinfo"  # jid -> JSON {"class", "message", "at"}
DIED = "died"  # jids that died
KIDS = "kids"  # every child batch
PENDING_KIDS = "pkids"  # children not yet complete
UNSUCCESSFUL_KIDS = "ukids"  # children not yet succeeded
SUFFIXES = (PENDING, FAILED, FAILINFO, DIED, KIDS, PENDING_KIDS, UNSUCCESSFUL_KIDS, *EVENTS)
HOLD_PREFIX = "hold:"  # a member of ``-jids`` that is a builder's hold, not a job


def new_bid() -> str:
    """14 URL-safe characters, as Sidekiq Pro makes a bid, never starting with ``-``:
    such an id would read as an option on a command line (``wurk batches show -x``)."""
    bid = secrets.token_urlsafe(10)
    return bid if not bid.startswith("-") else "_" + bid[1:]


def key(bid: str, suffix: str = "") -> str:
    """``b-<bid>`` or ``b-<bid>-<suffix>``."""
    return f"b-{bid}-{suffix}" if suffix else f"b-{bid}"


def all_keys(bid: str) -> list[str]:
    return [key(bid), *(key(bid, s) for s in SUFFIXES)]


def valid_bid(bid: Any) -> bool:
    return is_text(bid, MAX_BID)


def bid_of(payload: Mapping[str, Any]) -> str | None:
    """The payload's batch id when it is one we act on, else None."""
    bid = payload.get(FIELD)
    return bid if valid_bid(bid) else None

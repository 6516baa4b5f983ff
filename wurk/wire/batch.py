"""Batches on the wire: key names, limits and the read side of a batch record.

The layout follows Sidekiq Pro's as the Ruby ancestor documents it: a batch
is the hash ``b-<bid>`` plus sets named after it, listed in the ``batches``
sorted set, and each job of a batch carries the batch's id in its payload's
``bid`` field. The atomic steps are the Lua scripts of
:mod:`wurk.wire.batch_lua`.

Duties:
1. Name every key of a batch (:func:`key`) and the global index.
2. Hold the limits and times: bid length, expiry, the linger after success,
   the marker TTL.
3. Say whether a payload's ``bid`` is one we act on (:func:`bid_of`):
   a non-empty string of at most MAX_BID characters; anything else read
   from Redis is ignored, never raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELD = "bid"  # the payload field, as Sidekiq Pro writes it
INDEX = "batches"  # sorted set: bid scored by its creation time
MAX_BID = 64
EVENTS = ("complete", "success", "death")

DAY = 24 * 60 * 60
EXPIRY = 30 * DAY  # an unfinished batch's keys live this long from creation
MAX_EXPIRY = 90 * DAY  # the longest a batch may ask for; the index is pruned past it
LINGER = DAY  # a batch whose success fired is kept this long for the status API
ABANDONED_AFTER = DAY  # no progress for this long: an unfinished batch is shown abandoned
MARKER_TTL = 30 * DAY

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


def key(bid: str, suffix: str = "") -> str:
    """``b-<bid>`` or ``b-<bid>-<suffix>``."""
    return f"b-{bid}-{suffix}" if suffix else f"b-{bid}"


def all_keys(bid: str) -> list[str]:
    return [key(bid), *(key(bid, s) for s in SUFFIXES)]


def valid_bid(bid: Any) -> bool:
    return isinstance(bid, str) and 0 < len(bid) <= MAX_BID


def bid_of(payload: Mapping[str, Any]) -> str | None:
    """The payload's batch id when it is one we act on, else None."""
    bid = payload.get(FIELD)
    return bid if valid_bid(bid) else None

"""Job profiling: Sidekiq 8's ``profile`` contract, recorded with cProfile.

Duties:
1. Run a job whose payload carries a ``profile`` token under cProfile. The
   processor calls :func:`profiled` only for such payloads, so any other job
   pays one dict lookup and nothing else.
2. Store the result where Sidekiq 8 stores its own (spec section 11): the
   HASH ``<token>-<jid>`` with ``started_at``, ``token``, ``type``
   (``"cprofile"``), ``jid``, ``filename``, ``elapsed``, ``data`` (gzip of
   the pstats marshal dump, the ``.prof`` format snakeviz and
   ``python -m pstats`` open) and ``size``, expiring after ``profile_ttl``
   (one day), and the key in the ZSET ``profiles`` scored by its expiry.
   Failed runs are stored too: a slow job that times out is worth a look.
3. Never let profiling change a job's outcome: a profiler that cannot start
   or a profile that cannot be written is logged, and the job's own result
   stands.

Reading them back is :mod:`wurk.api.profiles`; the ``wurk profile`` command
is :mod:`wurk.admin.profiles`.
"""

from __future__ import annotations

import cProfile
import gzip
import marshal
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from wurk.core.logging import get_logger
from wurk.wire import keys

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime

log = get_logger("wurk.profiler")
T = TypeVar("T")
PROFILE_TYPE = "cprofile"
# The token a job option ``profile=True`` sends (Sidekiq's contract wants a string).
DEFAULT_TOKEN = "wurk"  # noqa: S105 - a label, not a secret
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def token_of(job: Mapping[str, Any]) -> str | None:
    """The profile token a payload asks for, or None (absent, empty, false)."""
    value = job.get("profile")
    if value is True:
        return DEFAULT_TOKEN
    if isinstance(value, str) and value:
        return value
    return None


def profiled(runtime: Runtime, job: Mapping[str, Any], run: Callable[[], T]) -> T:
    """``run()`` under cProfile when ``job`` asks for it, storing the profile afterwards."""
    token = token_of(job)
    if token is None:
        return run()
    profile = cProfile.Profile()
    started_at = time.time()
    started = time.perf_counter()
    try:
        profile.enable()
    except ValueError as exc:  # another profiler owns this thread (or, 3.12+, the process)
        log.warning("profile.unavailable", jid=job.get("jid"), error=str(exc))
        return run()
    try:
        result = run()
    finally:
        profile.disable()
    record(runtime, job, token, profile, started_at=started_at,
           elapsed=time.perf_counter() - started)
    return result


def record(runtime: Runtime, job: Mapping[str, Any], token: str, profile: cProfile.Profile, *,
           started_at: float, elapsed: float) -> str | None:
    """Write one profile to Redis; returns its key, or None when the write failed."""
    jid = str(job.get("jid", ""))
    cls = str(job.get("wrapped") or job.get("class"))
    profile.create_stats()
    data = gzip.compress(marshal.dumps(profile.stats))
    key = keys.profile(token, jid)
    ttl = runtime.config.profile_ttl
    fields = {"started_at": int(started_at), "token": token, "type": PROFILE_TYPE, "jid": jid,
              "filename": filename(token, cls, jid, started_at),
              "elapsed": repr(round(elapsed, 6)), "data": data, "size": len(data)}
    commands = [
        # Pruned here too, not only by readers: with no reader the index would only grow.
        ("ZREMRANGEBYSCORE", keys.PROFILES, "-inf", repr(time.time())),
        ("ZADD", keys.PROFILES, repr(time.time() + ttl), key),
        ("HSET", key, *(x for pair in fields.items() for x in pair)),
        ("EXPIRE", key, ttl),
    ]
    try:
        # Exact members and values: sending it twice leaves the same state.
        runtime.pool.pipeline(commands, transaction=True, idempotent=True)
    except Exception as exc:  # noqa: BLE001 - the job already ran; only its profile is lost
        log.error("profile.write_failed", key=key, error=f"{type(exc).__name__}: {exc}")
        return None
    log.info("profile.saved", key=key, jid=jid, size=len(data), elapsed=round(elapsed, 6))
    return key


def filename(token: str, cls: str, jid: str, started_at: float) -> str:
    """Sidekiq's ``<token>-<class>-<jid>-<YYYYmmdd-HHMMSS>`` naming, with ``.prof``."""
    stamp = datetime.fromtimestamp(started_at, UTC).strftime("%Y%m%d-%H%M%S")
    return _UNSAFE_IN_NAME.sub("_", f"{token}-{cls}-{jid}-{stamp}") + ".prof"

"""Per-job options: what ``@wurk.job(...)``, ``Job.options`` and ``.set(...)`` carry.

Duties:
1. Hold a job's options (queue, retry, backtrace, dead, retry_queue, tags,
   retry_for, profile, unique_for and unique_until, store_result and
   result_ttl, the jid of one push, and the process-side hooks retry_in,
   retries_exhausted and unique_key, and check_types) as one frozen value.
2. Check option values when they are given, with a TypeError that names
   the option (``make_options``); the time options (expiry, time limits,
   deadline) through :mod:`wurk.push.time_options`.
3. Give the options that travel in the payload (``payload_fields``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wurk.core.validate import is_count, is_whole
from wurk.observe.profiler import DEFAULT_TOKEN
from wurk.push import time_options
from wurk.results import records as results
from wurk.unique import push as unique

# Options that travel in the payload when set (Sidekiq's sidekiq_options).
PAYLOAD_OPTIONS = ("queue", "retry", "backtrace", "dead", "retry_queue", "tags", "retry_for",
                   "unique_for")
RetryIn = Callable[[int, BaseException, Mapping[str, Any]], "float | str | None"]
Exhausted = Callable[[Mapping[str, Any], BaseException], None]


@dataclass(frozen=True)
class JobOptions:
    queue: str = "default"
    retry: bool | int = True
    backtrace: bool | int | None = None
    dead: bool | None = None
    retry_queue: str | None = None
    tags: tuple[str, ...] | None = None
    retry_for: int | None = None
    # Profile every run with cProfile (wurk.observe.profiler): a token string, or True
    # for the default token. Sent as Sidekiq 8's "profile" payload key.
    profile: bool | str | None = None
    # Unique jobs (wurk.unique.push): the lock's seconds, and when it is released
    # ("success" when None, sent only when it is another).
    unique_for: int | float | None = None
    unique_until: str | None = None
    # Time options (wurk.push.time_options): seconds, or epoch seconds for the
    # absolute ones; sent as "expiry", "timeout", "hard_timeout", "deadline".
    expires_in: float | None = None
    expires_at: float | None = None
    timeout: float | None = None
    hard_timeout: float | None = None
    deadline: float | None = None
    # Job results (wurk.results.client): sent as "result_ttl" (seconds) when on.
    store_result: bool = False
    result_ttl: int | None = None
    # This push's jid (as ``client.push({"jid": ...})``): to push again a job
    # whose push raised PushOutcomeUnknown, once (wurk.push.landing).
    jid: str | None = None
    # Not sent: server-side hooks (Sidekiq's sidekiq_retry_in and
    # sidekiq_retries_exhausted blocks).
    retry_in: RetryIn | None = field(default=None, compare=False)
    retries_exhausted: Exhausted | None = field(default=None, compare=False)
    # Not sent either: the lock key's source in place of the arguments.
    unique_key: Callable[[list[Any]], str] | None = field(default=None, compare=False)
    # Not sent: refuse a push whose argument is not the JSON type its parameter's
    # annotation names (wurk.push.json_types). Fixed where the job is declared.
    check_types: bool = True

    def payload_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"queue": self.queue, "retry": self.retry}
        for name in PAYLOAD_OPTIONS[2:]:
            value = getattr(self, name)
            if value is not None:
                fields[name] = list(value) if name == "tags" else value
        if self.unique_for is not None and self.unique_until not in (None, "success"):
            fields["unique_until"] = self.unique_until
        if self.store_result:
            fields[results.TTL] = self.result_ttl or results.DEFAULT_TTL
        if self.profile:
            fields["profile"] = DEFAULT_TOKEN if self.profile is True else self.profile
        fields.update(time_options.payload_fields(self))
        if self.jid is not None:
            fields["jid"] = self.jid
        return fields


def declared_options(base: JobOptions | None = None, **changes: Any) -> JobOptions:
    """:func:`make_options` for a job's declaration (``@wurk.job``, a ``wurk.Job``
    class), where a jid would give every push of the job the same one."""
    if "jid" in changes:
        raise TypeError("jid is given per push (.set(jid=...)), not with the job")
    return make_options(base, **changes)


def make_options(base: JobOptions | None = None, **changes: Any) -> JobOptions:
    unknown = set(changes) - {f for f in JobOptions.__dataclass_fields__}
    if unknown:
        raise TypeError(f"unknown job option {sorted(unknown)[0]!r}")
    if "tags" in changes and changes["tags"] is not None:
        if isinstance(changes["tags"], str) or not all(isinstance(t, str) for t in changes["tags"]):
            raise TypeError("tags must be a list of strings")
        changes["tags"] = tuple(changes["tags"])
    retry = changes.get("retry", True)
    if not (isinstance(retry, bool) or is_count(retry)):
        raise TypeError(f"retry must be true, false or a non-negative int, got {retry!r}")
    if not isinstance(changes.get("profile"), bool | str | None):
        raise TypeError(f"profile must be a token string or a bool, got {changes['profile']!r}")
    unique.check_options(changes)
    if not isinstance(changes.get("check_types", True), bool):
        raise TypeError(f"check_types must be true or false, got {changes['check_types']!r}")
    _check_results(base, changes)
    jid = changes.get("jid")
    if jid is not None and (not isinstance(jid, str) or not jid):
        raise TypeError(f"jid must be a non-empty string, got {jid!r}")
    queue = changes.get("queue", "default")
    if not isinstance(queue, str) or not queue:
        raise TypeError(f"queue must be a non-empty string, got {queue!r}")
    time_options.check_changes(changes, base)
    return replace(base or JobOptions(), **changes)


def _check_results(base: JobOptions | None, changes: dict[str, Any]) -> None:
    store = changes.get("store_result", base.store_result if base else False)
    if not isinstance(store, bool):
        raise TypeError(f"store_result must be true or false, got {store!r}")
    ttl = changes.get("result_ttl")
    if ttl is None:
        return
    if not is_whole(ttl) or not 1 <= ttl <= results.MAX_TTL:
        raise TypeError(f"result_ttl must be whole seconds from 1 to {results.MAX_TTL}, "
                        f"got {ttl!r}")
    if not store:
        raise TypeError("result_ttl is only used with store_result=True")

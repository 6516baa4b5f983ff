"""The enqueue verbs, typed from the job's own signature.

Duties:
1. ``Enqueuer[P]``: ``perform_async``, ``perform_in``, ``perform_at``,
   ``perform_bulk``, their awaitable ``a``-forms and ``set(...)``, bound to
   a job name, its options and maybe a client. ``P`` is the job's parameter
   list (a ``ParamSpec``), so a type checker holds every push to the job's
   signature: count, types and keyword names.
2. Check each push against the job's signature and annotations
   (:mod:`wurk.push.signatures`) before anything reaches Redis.
3. Write keyword arguments as :mod:`wurk.wire.keywords` says; a push with
   none writes the payload it always wrote.
4. ``JobArgs[P]``: one job's arguments for ``perform_bulk``, built by the
   job's ``args(...)`` so the type checker sees them too.

The time a verb takes (``seconds``, ``when``) and the verbs' own ``self``
are positional-only, so a job may have a parameter of that name and still
take it by keyword.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, ParamSpec

from wurk.core.validate import is_number
from wurk.push import prepare, signatures
from wurk.push.aclient import AsyncClient
from wurk.push.client import Client
from wurk.push.options import JobOptions, make_options
from wurk.push.prepare import epoch_seconds
from wurk.push.time_options import aware_epoch
from wurk.wire import keywords
from wurk.wire.payload import ArgumentError

P = ParamSpec("P")

# Options fixed where the job is declared, never per push.
DECLARED_ONLY = ("unique_key", "check_types")


class JobArgs(Generic[P]):
    """One job's arguments, as the job's ``args(...)`` took them (for ``perform_bulk``)."""

    __slots__ = ("args", "kwargs")

    def __init__(self, /, *args: P.args, **kwargs: P.kwargs) -> None:
        self.args: tuple[Any, ...] = args
        self.kwargs: dict[str, Any] = kwargs

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"JobArgs({', '.join(shown)})"


class Enqueuer(Generic[P]):
    """The enqueue verbs, bound to a job name and options (and maybe a client)."""

    def __init__(self, name: str, options: JobOptions,
                 client: Client | AsyncClient | None = None) -> None:
        self.name = name
        self.options = options
        self._client = client

    def _target(self) -> Client:
        if isinstance(self._client, AsyncClient):
            raise TypeError(f"{self.name}: this enqueuer pushes through an AsyncClient; "
                            "use await .aperform_async() and the other a-verbs")
        # In testing mode every push of the verbs goes to its client, a given one's too.
        return Client.stand_in or self._client or Client.default()

    def _atarget(self) -> AsyncClient:
        if isinstance(self._client, Client):
            raise TypeError(f"{self.name}: this enqueuer pushes through a sync Client; "
                            "use .perform_async() or set(client=wurk.AsyncClient(...))")
        return AsyncClient.stand_in or self._client or AsyncClient.default()

    def set(self, *, client: Client | AsyncClient | None = None, **options: Any) -> Enqueuer[P]:
        """A copy with some options changed for the pushes made through it."""
        for name in DECLARED_ONLY:
            if name in options:
                raise TypeError(f"{name} is declared with the job (@wurk.job or the class), "
                                "not per push")
        return Enqueuer(self.name, make_options(self.options, **options), client or self._client)

    def args(self, /, *args: P.args, **kwargs: P.kwargs) -> JobArgs[P]:
        """One job's arguments for :meth:`perform_bulk`, checked by the type checker."""
        return JobArgs(*args, **kwargs)

    def perform_async(self, /, *args: P.args, **kwargs: P.kwargs) -> str | None:
        return self._target().push(self._item(args, kwargs))

    def perform_in(self, seconds: float, /, *args: P.args, **kwargs: P.kwargs) -> str | None:
        return self._target().push(self._item(args, kwargs, delay=seconds))

    def perform_at(self, when: float | datetime, /, *args: P.args,
                   **kwargs: P.kwargs) -> str | None:
        """``when`` is an epoch timestamp in seconds or a timezone-aware datetime."""
        return self._target().push(self._item(args, kwargs, at=_epoch(when)))

    def perform_bulk(self, args: Iterable[Sequence[Any] | JobArgs[P]]) -> list[str]:
        """Push one job per argument list or ``args(...)`` (1,000 per round trip);
        returns the jids. Every job is checked (by the client, as any bulk push)
        before anything is sent, so a bad one pushes nothing."""
        return self._target().push_bulk(self._bulk_item(args))

    # The same verbs for async code, awaited on the running loop's AsyncClient.
    async def aperform_async(self, /, *args: P.args, **kwargs: P.kwargs) -> str | None:
        return await self._atarget().push(self._item(args, kwargs))

    async def aperform_in(self, seconds: float, /, *args: P.args,
                          **kwargs: P.kwargs) -> str | None:
        return await self._atarget().push(self._item(args, kwargs, delay=seconds))

    async def aperform_at(self, when: float | datetime, /, *args: P.args,
                          **kwargs: P.kwargs) -> str | None:
        return await self._atarget().push(self._item(args, kwargs, at=_epoch(when)))

    async def aperform_bulk(self, args: Iterable[Sequence[Any] | JobArgs[P]]) -> list[str]:
        return await self._atarget().push_bulk(self._bulk_item(args))

    def _item(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
              delay: float | None = None, at: float | None = None) -> dict[str, Any]:
        signatures.check(self.name, args, "", kwargs)
        if not kwargs:  # positional: the payload as it always was
            return prepare.job_item(self.name, list(args), self.options, delay=delay, at=at)
        item = prepare.job_item(self.name, keywords.encode(args, kwargs), self.options,
                                delay=delay, at=at)
        item[keywords.MARKER] = True
        return item

    def _bulk_item(self, args: Iterable[Sequence[Any] | JobArgs[P]]) -> dict[str, Any]:
        if self.options.jid is not None:
            raise TypeError("set(jid=...) names one push: perform_bulk gives each job its own "
                            "jid (retry a bulk push whose outcome is unknown with error.retry())")
        calls = [(one.args, one.kwargs) if isinstance(one, JobArgs) else (list(one), _NO_KEYWORDS)
                 for one in args]
        # Each job is checked against the signature once, by the client's whole-push
        # check (wurk.push.prepare.check_bulk), before anything is sent.
        item = {**self.options.payload_fields(), "class": self.name}
        if not any(named for _, named in calls):
            item["args"] = [list(positional) for positional, _ in calls]
            return item
        # One marker for the whole push: every job gets its (maybe empty) keywords.
        item["args"] = [keywords.encode(positional, named) for positional, named in calls]
        item[keywords.MARKER] = True
        return item


_NO_KEYWORDS: Mapping[str, Any] = {}


def _epoch(when: float | datetime) -> float:
    if isinstance(when, datetime):
        return aware_epoch("perform_at", when, ArgumentError)
    if not is_number(when):
        raise ArgumentError(f"perform_at needs epoch seconds or an aware datetime, got {when!r}")
    return epoch_seconds(when, "perform_at's time")

"""Jobs: ``@wurk.job`` functions, ``wurk.Job`` classes, and the registry.

Duties:
1. Register each job under its wire name (the payload's ``class``). A worker
   resolves a payload's class only through this registry, never by importing
   whatever module a payload names.
2. Carry per-job options (queue, retry, backtrace, dead, retry_queue, tags,
   profile, unique_for, unique_until; retry_in, retries_exhausted and
   unique_key stay in the process) into the payload at push time.
3. Give every job the enqueue verbs: ``perform_async``, ``perform_in``,
   ``perform_at``, ``perform_bulk`` and ``set(...)`` for one-off option
   overrides; each checks its arguments against the job's signature
   (``wurk.push.signatures``) before anything reaches Redis. Async code
   awaits the same verbs with an ``a`` prefix (``aperform_async`` ...),
   pushed through :class:`wurk.push.aclient.AsyncClient`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar, overload

from wurk.push import signatures, unique
from wurk.push.aclient import AsyncClient
from wurk.push.client import Client
from wurk.push.options import JobOptions, make_options
from wurk.wire.payload import ArgumentError

P = ParamSpec("P")
R = TypeVar("R")

class UnknownJobError(LookupError):
    """A payload names a class that no registered job answers to."""

    @classmethod
    def for_name(cls, name: str) -> UnknownJobError:
        return cls(
            f"no job is registered as {name!r}; register it with @wurk.job(name=...) "
            "or list its module in require"
        )


class DuplicateJobError(ValueError):
    """Two different jobs were registered under one name."""


@dataclass(frozen=True)
class Registered:
    """What the worker needs to run one job name."""

    name: str
    options: JobOptions
    # Builds the callable for one execution: for a class, a fresh instance's
    # perform bound to the jid; for a function, the function.
    factory: Callable[[Mapping[str, Any]], Callable[..., Any]]
    # Where it was defined ("module.qualname"): re-registering the same
    # definition (a module imported twice) is fine, a different one is not.
    origin: str = ""
    # The argument counts a push is checked against (None: not checked).
    arity: signatures.Arity | None = None


class Registry:
    """Job name -> Registered. Thread-safe; one default instance per process."""

    def __init__(self) -> None:
        self._jobs: dict[str, Registered] = {}
        self._lock = threading.Lock()

    def add(self, entry: Registered) -> None:
        with self._lock:
            existing = self._jobs.get(entry.name)
            if existing is not None and existing.origin != entry.origin:
                raise DuplicateJobError(
                    f"job name {entry.name!r} is already registered by {existing.origin}; "
                    f"give {entry.origin} another name="
                )
            self._jobs[entry.name] = entry
        signatures.remember(entry.name, entry.arity)
        unique.remember(entry.name, entry.options.unique_key)

    def get(self, name: str) -> Registered:
        try:
            return self._jobs[name]
        except KeyError:
            raise UnknownJobError.for_name(name) from None

    def find(self, name: str) -> Registered | None:
        return self._jobs.get(name)

    def names(self) -> list[str]:
        return sorted(self._jobs)

    def discard(self, name: str) -> None:
        with self._lock:
            self._jobs.pop(name, None)
        signatures.forget(name)
        unique.forget(name)


registry = Registry()


class Enqueuer:
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
        return self._client or Client.default()

    def _atarget(self) -> AsyncClient:
        if isinstance(self._client, Client):
            raise TypeError(f"{self.name}: this enqueuer pushes through a sync Client; "
                            "use .perform_async() or set(client=wurk.AsyncClient(...))")
        return self._client or AsyncClient.default()

    def set(self, *, client: Client | AsyncClient | None = None, **options: Any) -> Enqueuer:
        """A copy with some options changed for the pushes made through it."""
        if "unique_key" in options:
            raise TypeError("unique_key is declared with the job (@wurk.job or the class), "
                            "not per push")
        return Enqueuer(self.name, make_options(self.options, **options), client or self._client)

    def perform_async(self, *args: Any) -> str | None:
        return self._target().push_job(self.name, self._checked(args), self.options)

    def perform_in(self, seconds: float, *args: Any) -> str | None:
        return self._target().push_job(self.name, self._checked(args), self.options,
                                       delay=seconds)

    def perform_at(self, when: float | datetime, *args: Any) -> str | None:
        """``when`` is an epoch timestamp in seconds or a timezone-aware datetime."""
        at = _epoch(when)
        return self._target().push_job(self.name, self._checked(args), self.options, at=at)

    def perform_bulk(self, args: Iterable[Sequence[Any]]) -> list[str]:
        """Push one job per argument list (1,000 per round trip); returns the jids.

        Every list is checked before anything is sent, so a bad one pushes nothing.
        """
        return self._target().push_bulk(self._bulk_item(args))

    # The same verbs for async code, awaited on the running loop's AsyncClient.
    async def aperform_async(self, *args: Any) -> str | None:
        return await self._atarget().push_job(self.name, self._checked(args), self.options)

    async def aperform_in(self, seconds: float, *args: Any) -> str | None:
        return await self._atarget().push_job(self.name, self._checked(args), self.options,
                                              delay=seconds)

    async def aperform_at(self, when: float | datetime, *args: Any) -> str | None:
        at = _epoch(when)
        return await self._atarget().push_job(self.name, self._checked(args), self.options,
                                              at=at)

    async def aperform_bulk(self, args: Iterable[Sequence[Any]]) -> list[str]:
        return await self._atarget().push_bulk(self._bulk_item(args))

    def _checked(self, args: tuple[Any, ...]) -> list[Any]:
        signatures.check(self.name, args)
        return list(args)

    def _bulk_item(self, args: Iterable[Sequence[Any]]) -> dict[str, Any]:
        all_args = [list(one) for one in args]
        for i, one in enumerate(all_args):
            signatures.check(self.name, one, f" in args[{i}]")
        return {**self.options.payload_fields(), "class": self.name, "args": all_args}


def _epoch(when: float | datetime) -> float:
    if isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise ArgumentError(f"perform_at needs a timezone-aware datetime, got naive {when!r} "
                                "(use datetime.now(UTC) or .replace(tzinfo=...))")
        return when.timestamp()
    if isinstance(when, bool) or not isinstance(when, int | float):
        raise ArgumentError(f"perform_at needs epoch seconds or an aware datetime, got {when!r}")
    return float(when)


class JobFunction(Enqueuer, Generic[P, R]):
    """A function registered with ``@wurk.job``; calling it runs it inline."""

    def __init__(self, fn: Callable[P, R], name: str, options: JobOptions) -> None:
        super().__init__(name, options)
        self.fn = fn
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


def _origin_of(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@overload
def job(name: Callable[P, R], /) -> JobFunction[P, R]: ...


@overload
def job(name: str | None = None, *, registry_: Registry | None = None,
        **options: Any) -> Callable[[Callable[P, R]], JobFunction[P, R]]: ...


def job(name: Any = None, *, registry_: Registry | None = None, **options: Any) -> Any:
    """Register a function as a job: ``@wurk.job(queue="mail", retry=5)`` or bare ``@wurk.job``."""
    if callable(name):
        return job(registry_=registry_, **options)(name)
    opts = make_options(**options)

    def register(fn: Callable[P, R]) -> JobFunction[P, R]:
        wire_name = name or f"{fn.__module__}.{fn.__qualname__}"
        wrapper = JobFunction(fn, wire_name, opts)
        entry = Registered(wire_name, opts, lambda _payload: fn, _origin_of(fn),
                           signatures.Arity.of(wire_name, fn))
        (registry_ or registry).add(entry)
        return wrapper

    return register


class Job:
    """Base class for class-style jobs; subclasses define ``perform``.

    ``class Mailer(wurk.Job, queue="mail", retry=3): def perform(self, to): ...``
    Subclasses may also define ``retry_in(self, count, exc)`` and
    ``retries_exhausted(cls, payload, exc)`` as Sidekiq's blocks.
    """

    wurk_name: ClassVar[str]
    wurk_options: ClassVar[JobOptions]
    jid: str
    payload: Mapping[str, Any]

    def __init_subclass__(cls, *, name: str | None = None, abstract: bool = False,
                          **options: Any) -> None:
        super().__init_subclass__()
        if abstract:
            return
        inherited = getattr(cls, "wurk_options", None)
        opts = make_options(inherited, **options)
        if "retry_in" in cls.__dict__:
            hook = cls.__dict__["retry_in"]
            opts = replace(opts, retry_in=lambda count, exc, _p: hook(cls(), count, exc))
        if "retries_exhausted" in cls.__dict__:
            exhausted = getattr(cls, "retries_exhausted")  # noqa: B009
            opts = replace(opts, retries_exhausted=exhausted)
        cls.wurk_options = opts
        cls.wurk_name = name or f"{cls.__module__}.{cls.__qualname__}"
        registry.add(Registered(cls.wurk_name, opts, cls._bound_perform, _origin_of(cls),
                                signatures.Arity.of(cls.wurk_name, cls.perform, bound=True)))

    @classmethod
    def _bound_perform(cls, payload: Mapping[str, Any]) -> Callable[..., Any]:
        instance = cls()
        instance.jid = str(payload.get("jid", ""))
        instance.payload = payload
        return instance.perform

    def perform(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define perform()")

    @classmethod
    def enqueuer(cls) -> Enqueuer:
        return Enqueuer(cls.wurk_name, cls.wurk_options)

    @classmethod
    def set(cls, **options: Any) -> Enqueuer:
        return cls.enqueuer().set(**options)

    @classmethod
    def perform_async(cls, *args: Any) -> str | None:
        return cls.enqueuer().perform_async(*args)

    @classmethod
    def perform_in(cls, seconds: float, *args: Any) -> str | None:
        return cls.enqueuer().perform_in(seconds, *args)

    @classmethod
    def perform_at(cls, when: float | datetime, *args: Any) -> str | None:
        return cls.enqueuer().perform_at(when, *args)

    @classmethod
    def perform_bulk(cls, args: Iterable[Sequence[Any]]) -> list[str]:
        return cls.enqueuer().perform_bulk(args)

    @classmethod
    async def aperform_async(cls, *args: Any) -> str | None:
        return await cls.enqueuer().aperform_async(*args)

    @classmethod
    async def aperform_in(cls, seconds: float, *args: Any) -> str | None:
        return await cls.enqueuer().aperform_in(seconds, *args)

    @classmethod
    async def aperform_at(cls, when: float | datetime, *args: Any) -> str | None:
        return await cls.enqueuer().aperform_at(when, *args)

    @classmethod
    async def aperform_bulk(cls, args: Iterable[Sequence[Any]]) -> list[str]:
        return await cls.enqueuer().aperform_bulk(args)

"""Jobs: ``@wurk.job`` functions, ``wurk.Job`` classes, and the registry.

Duties:
1. Register each job under its wire name (the payload's ``class``). A worker
   resolves a payload's class only through this registry, never by importing
   whatever module a payload names.
2. Carry per-job options (queue, retry, backtrace, dead, retry_queue, tags,
   profile, unique_for, unique_until; retry_in, retries_exhausted and
   unique_key stay in the process) into the payload at push time.
3. Give every job the enqueue verbs (:mod:`wurk.push.enqueuer`):
   ``perform_async``, ``perform_in``, ``perform_at``, ``perform_bulk`` and
   ``set(...)`` for one-off option overrides, typed from the job's own
   signature (a function's, or a class's ``perform``), so a type checker
   holds each push to it; each checks its arguments, keywords and annotated
   JSON types (``wurk.push.signatures``) before anything reaches Redis.
   Async code awaits the same verbs with an ``a`` prefix
   (``aperform_async`` ...), pushed through
   :class:`wurk.push.aclient.AsyncClient`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Generic, ParamSpec, Protocol, TypeVar, overload

from wurk.core import cancelling
from wurk.push import signatures
from wurk.push.enqueuer import Enqueuer, JobArgs
from wurk.push.options import JobOptions, declared_options, make_options
from wurk.unique import push as unique
from wurk.wire.payload import new_jid

__all__ = ["DuplicateJobError", "Enqueuer", "Job", "JobArgs", "JobFunction", "JobOptions",
           "Registered", "Registry", "UnknownJobError", "job", "make_options", "registry"]

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
    # An ``async def`` function or perform: the worker awaits what it returns.
    coroutine: bool = False


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


class JobFunction(Enqueuer[P], Generic[P, R]):
    """A function registered with ``@wurk.job``; calling it runs it inline."""

    def __init__(self, fn: Callable[P, R], name: str, options: JobOptions) -> None:
        super().__init__(name, options)
        self.fn = fn
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


def _is_async(fn: Callable[..., Any]) -> bool:
    """A coroutine function, also under a ``functools.wraps`` decorator that is not one."""
    if inspect.iscoroutinefunction(fn):
        return True
    try:
        return inspect.iscoroutinefunction(inspect.unwrap(fn))
    except ValueError:  # a __wrapped__ cycle: take it as it says it is
        return False


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
    opts = declared_options(**options)

    def register(fn: Callable[P, R]) -> JobFunction[P, R]:
        wire_name = name or f"{fn.__module__}.{fn.__qualname__}"
        wrapper = JobFunction(fn, wire_name, opts)
        entry = Registered(wire_name, opts, lambda _payload: fn, _origin_of(fn),
                           signatures.Arity.of(wire_name, fn, check_types=opts.check_types),
                           coroutine=_is_async(fn))
        (registry_ or registry).add(entry)
        return wrapper

    return register


class _Performs(Protocol[P]):
    """A job class, as the verbs see it: its ``perform`` gives the push's parameters."""

    def perform(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...


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
        opts = declared_options(inherited, **options)
        if "retry_in" in cls.__dict__:
            hook = cls.__dict__["retry_in"]
            opts = replace(opts, retry_in=lambda count, exc, _p: hook(cls(), count, exc))
        if "retries_exhausted" in cls.__dict__:
            exhausted = getattr(cls, "retries_exhausted")  # noqa: B009
            opts = replace(opts, retries_exhausted=exhausted)
        cls.wurk_options = opts
        cls.wurk_name = name or f"{cls.__module__}.{cls.__qualname__}"
        registry.add(Registered(cls.wurk_name, opts, cls._bound_perform, _origin_of(cls),
                                signatures.Arity.of(cls.wurk_name, cls.perform, bound=True,
                                                    check_types=opts.check_types),
                                coroutine=_is_async(cls.perform)))

    @classmethod
    def _bound_perform(cls, payload: Mapping[str, Any]) -> Callable[..., Any]:
        instance = cls()
        instance.jid = str(payload.get("jid", ""))
        instance.payload = payload
        return instance.perform

    def perform(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define perform()")

    @property
    def cancelled(self) -> bool:
        """True once a person cancelled this run (``wurk cancel JID``): the same
        as ``wurk.cancelled()``; False outside a worker's run."""
        return cancelling.cancelled()

    def __getattr__(self, name: str) -> Any:
        # An instance no worker made (a unit test's ``MyJob().perform("x")``)
        # has no run: it gets a jid and a payload of its own when first asked.
        if name == "jid":
            self.jid = new_jid()
            return self.jid
        if name == "payload":
            options = getattr(type(self), "wurk_options", None)
            fields = options.payload_fields() if options is not None else {}
            self.payload = {"retry": True, "queue": "default", **fields, "args": [],
                            "class": getattr(type(self), "wurk_name", type(self).__name__),
                            "jid": self.jid}
            return self.payload
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def enqueuer(cls: type[_Performs[P]]) -> Enqueuer[P]:
        return Enqueuer(_declared(cls).wurk_name, _declared(cls).wurk_options)

    @classmethod
    def set(cls: type[_Performs[P]], **options: Any) -> Enqueuer[P]:
        declared = _declared(cls)
        enqueuer: Enqueuer[P] = Enqueuer(declared.wurk_name, declared.wurk_options)
        return enqueuer.set(**options)

    @classmethod
    def args(cls: type[_Performs[P]], /, *args: P.args, **kwargs: P.kwargs) -> JobArgs[P]:
        """One job's arguments for :meth:`perform_bulk`, checked by the type checker."""
        return JobArgs(*args, **kwargs)

    @classmethod
    def perform_async(cls: type[_Performs[P]], /, *args: P.args,
                      **kwargs: P.kwargs) -> str | None:
        return _declared(cls).enqueuer().perform_async(*args, **kwargs)

    @classmethod
    def perform_in(cls: type[_Performs[P]], seconds: float, /, *args: P.args,
                   **kwargs: P.kwargs) -> str | None:
        return _declared(cls).enqueuer().perform_in(seconds, *args, **kwargs)

    @classmethod
    def perform_at(cls: type[_Performs[P]], when: float | datetime, /, *args: P.args,
                   **kwargs: P.kwargs) -> str | None:
        return _declared(cls).enqueuer().perform_at(when, *args, **kwargs)

    @classmethod
    def perform_bulk(cls: type[_Performs[P]],
                     args: Iterable[Sequence[Any] | JobArgs[P]]) -> list[str]:
        return _declared(cls).enqueuer().perform_bulk(args)

    @classmethod
    async def aperform_async(cls: type[_Performs[P]], /, *args: P.args,
                             **kwargs: P.kwargs) -> str | None:
        return await _declared(cls).enqueuer().aperform_async(*args, **kwargs)

    @classmethod
    async def aperform_in(cls: type[_Performs[P]], seconds: float, /, *args: P.args,
                          **kwargs: P.kwargs) -> str | None:
        return await _declared(cls).enqueuer().aperform_in(seconds, *args, **kwargs)

    @classmethod
    async def aperform_at(cls: type[_Performs[P]], when: float | datetime, /, *args: P.args,
                          **kwargs: P.kwargs) -> str | None:
        return await _declared(cls).enqueuer().aperform_at(when, *args, **kwargs)

    @classmethod
    async def aperform_bulk(cls: type[_Performs[P]],
                            args: Iterable[Sequence[Any] | JobArgs[P]]) -> list[str]:
        return await _declared(cls).enqueuer().aperform_bulk(args)


def _declared(cls: type[Any]) -> type[Job]:
    """The class a verb was called on, as the job class it is (the verbs' ``cls``
    is typed by its ``perform`` alone, which is what carries ``P``)."""
    return cls

"""Pushes that wait for the database transaction they were made in.

A job pushed inside ``transaction.atomic`` can run before the rows it needs
are committed (the worker does not see them yet) or after they were rolled
back (they never existed). Django answers this with ``transaction.on_commit``;
this module applies it to pushes, as Sidekiq's ``transactional_push!`` does.

Duties:
1. :class:`OnCommit`, a client middleware (:mod:`.conf` puts it first in
   every config's chain): a push made inside an atomic block of its
   database is deferred (``wurk.push.middleware.defer``) to that
   transaction's commit, and dropped with a rollback. The push still
   returns the job's jid at once (it was allocated before the chain ran).
   Outside an atomic block, and on the deferred push's second pass at the
   commit, it lets the push through.
2. Whether it defers: ``settings.WURK_ON_COMMIT`` (default True, the
   recommended setting), overridden for the pushes inside ``with
   on_commit(...)``; :func:`enqueue_on_commit` is one push that waits.
3. A deferred push meets Redis at the commit: with ``reliable_push`` (the
   default) a refused one waits in memory and then the spool, as any push;
   without it, the error raises out of the ``atomic`` block that committed,
   after the data is committed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS, transaction

from wurk.push import middleware

# Set by ``with on_commit(...)``: (defer or not, the database alias).
_asked: ContextVar[tuple[bool, str] | None] = ContextVar("wurk_django_on_commit", default=None)
# True while a deferred push is written: it is never deferred twice (a test's
# captureOnCommitCallbacks runs callbacks inside the test's own atomic block).
_resuming: ContextVar[bool] = ContextVar("wurk_django_resuming", default=False)


class Pushable(Protocol):
    def perform_async(self, *args: Any) -> str | None: ...


class OnCommit:
    """Client middleware deferring a push made in a transaction to its commit."""

    def __init__(self, using: str = DEFAULT_DB_ALIAS, *, automatic: bool = True) -> None:
        self.using = using
        self.automatic = automatic

    def __call__(self, job_class: str, payload: dict[str, Any], queue: str, redis: Any,
                 call_next: Callable[[], Any]) -> Any:
        asked = _asked.get()
        wanted, using = asked if asked is not None else (self.automatic, self.using)
        if not wanted or _resuming.get() or not transaction.get_connection(using).in_atomic_block:
            return call_next()
        transaction.on_commit(_resumed(middleware.defer()), using=using)
        return None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OnCommit) and other.using == self.using
                and other.automatic == self.automatic)

    def __hash__(self) -> int:
        return hash((OnCommit, self.using, self.automatic))

    def __repr__(self) -> str:
        return f"OnCommit(using={self.using!r}, automatic={self.automatic})"


def _resumed(push: Callable[[], object]) -> Callable[[], None]:
    def resume() -> None:
        token = _resuming.set(True)
        try:
            push()
        finally:
            _resuming.reset(token)

    return resume


@contextlib.contextmanager
def on_commit(defer: bool = True, *, using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Pushes inside wait for ``using``'s commit (``defer=False``: they go at once),
    whatever ``WURK_ON_COMMIT`` says."""
    token = _asked.set((defer, using))
    try:
        yield
    finally:
        _asked.reset(token)


def enqueue_on_commit(job: Pushable, *args: Any, using: str = DEFAULT_DB_ALIAS) -> str | None:
    """``job.perform_async(*args)`` once the current transaction commits; the jid now."""
    with on_commit(True, using=using):
        return job.perform_async(*args)

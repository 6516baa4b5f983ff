"""Django's database connections across a fork and around each job.

A connection is a socket (or an SQLite handle) that one process opened; two
processes that share one corrupt each other's conversation, and a child
that closes an inherited connection politely (PostgreSQL's Terminate)
closes the parent's too. Django keeps one connection per database per
thread.

Duties:
1. :func:`close_before_fork`: before any ``os.fork`` (a swarm forking its
   children), close the forking thread's connections, so a child inherits
   none. One inside ``transaction.atomic`` stays open (closing it would lose
   the parent's transaction) and is logged.
2. :func:`forget_in_child`: right after the fork, in the child, drop what
   was still inherited without a byte on its socket, and keep the object
   referenced so that no finaliser sends one later; the next query dials
   a connection of the child's own.
3. :func:`fresh_connections`: server middleware that runs Django's
   ``close_old_connections`` before and after each job, as Django does
   around each request: a job never starts on a connection that is broken
   or past ``CONN_MAX_AGE``, and leaves none behind it. A failure to close
   after the job is logged, never turned into the job's failure (a retry
   would run a job that succeeded again).
4. :func:`install_fork_hooks`: register 1 and 2 with ``os.register_at_fork``,
   once per process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from django.db import close_old_connections, connections

from wurk.core.logging import get_logger
from wurk.core.threads import describe

log = get_logger("wurk.django")
# Inherited connections a child must never close nor let be collected.
_inherited: list[Any] = []
_installed = threading.Lock()
_done: list[bool] = []


def close_before_fork() -> None:
    """Close this thread's connections; never raises (it runs inside os.fork)."""
    try:
        for conn in connections.all(initialized_only=True):
            if conn.in_atomic_block:
                log.warning("django.fork_in_transaction", database=conn.alias,
                            hint="a connection inside transaction.atomic stays open; "
                                 "the child forgets its copy")
                continue
            conn.close()
    except Exception as exc:  # noqa: BLE001 - a fork hook must not fail the fork
        log.error("django.close_before_fork_failed", error=describe(exc))


def forget_in_child() -> None:
    """Drop inherited connections without closing them; never raises."""
    try:
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                _inherited.append(conn.connection)
                conn.connection = None
            # What the parent's transaction left on this thread is not ours.
            conn.in_atomic_block = False
            conn.savepoint_ids = []
            conn.atomic_blocks = []
            conn.needs_rollback = False
            conn.closed_in_transaction = False
            conn.run_on_commit = []
    except Exception as exc:  # noqa: BLE001 - the child carries on with fresh connections
        log.error("django.forget_in_child_failed", error=describe(exc))


def fresh_connections(payload: Mapping[str, Any], queue: str,
                      call_next: Callable[[], Any]) -> Any:
    """Server middleware: ``close_old_connections`` around one job."""
    close_old_connections()
    try:
        return call_next()
    finally:
        try:
            close_old_connections()
        except Exception as exc:  # noqa: BLE001 - the job's outcome stands
            log.warning("django.close_after_job_failed", jid=payload.get("jid"),
                        error=describe(exc))


def install_fork_hooks() -> None:
    with _installed:
        if not _done:
            os.register_at_fork(before=close_before_fork, after_in_child=forget_in_child)
            _done.append(True)

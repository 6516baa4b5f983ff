"""Errors the admin API raises when a lookup or a command cannot be honoured.

Duties:
1. Give the CLI and other callers one exception per "that does not exist"
   case, each a :class:`LookupError` whose message names what was asked for.
2. Refuse remote control a process cannot obey (quiet/stop of an embedded
   worker, as Sidekiq 8 does) with :class:`ProcessControlError`.
3. Hand death handlers a :class:`JobKilledError` for a job killed by hand;
   name what a deleted job's batch and waiters hear (:class:`JobDeletedError`).
"""

from __future__ import annotations


class UnknownQueueError(LookupError):
    """No queue of that name is listed in the ``queues`` set."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown queue {name!r} (not in the 'queues' set)")
        self.name = name


class UnknownProcessError(LookupError):
    """No live process has that identity (never registered, or its heartbeat expired)."""

    def __init__(self, identity: str) -> None:
        super().__init__(f"no live process with identity {identity!r}")
        self.identity = identity


class JobNotFoundError(LookupError):
    """No job with that jid is in the structure searched."""

    def __init__(self, jid: str, where: str) -> None:
        super().__init__(f"no job with jid {jid!r} in {where}")
        self.jid = jid
        self.where = where


class JobKilledError(RuntimeError):
    """What death handlers receive for a job killed from the API (and the error
    class its batch and its result waiters are told)."""


class JobDeletedError(RuntimeError):
    """The error class a deleted job's batch and result waiters are told: it
    was removed by a person and never runs (see ``wurk.api.removal``)."""


class ProcessControlError(RuntimeError):
    """A remote-control command the target process cannot act on."""

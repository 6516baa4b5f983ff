"""How a Rails ActiveJob payload is shown: the job it wraps, and its arguments.

Rails pushes every ActiveJob through one wrapper class, so the ``class``
field says little. Sidekiq's API (``JobRecord#display_class`` and
``#display_args``) unwraps it; this module does the same, so wurk.api, the
admin CLI and Sidekiq's Web UI show a shared Redis alike:

1. Both wrapper names count: Rails' adapter
   (``ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper``) and Sidekiq
   7.3+'s own (``Sidekiq::ActiveJob::Wrapper``).
2. The shown class is ``wrapped`` (or the first argument); a mailer job
   shows as ``Mailer#method``.
3. The shown arguments are the inner ``arguments`` with ActiveJob's
   bookkeeping removed: a GlobalID hash becomes its ``gid://`` string and
   keys starting ``_aj_`` (``_aj_symbol_keys``, ``_aj_ruby2_keywords``...)
   are dropped. A mailer's first three arguments (mailer, method, delivery
   method) are dropped; ``MailDeliveryJob`` shows its ``params`` and ``args``.
"""

from __future__ import annotations

from typing import Any

WRAPPERS = frozenset({"ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
                      "Sidekiq::ActiveJob::Wrapper"})
DELIVERY_JOB = "ActionMailer::DeliveryJob"
MAIL_DELIVERY_JOB = "ActionMailer::MailDeliveryJob"
ACTIVE_JOB_PREFIX = "_aj_"
GLOBALID_KEY = "_aj_globalid"


def is_wrapped(item: dict[str, Any]) -> bool:
    return item.get("class") in WRAPPERS


def job_class(item: dict[str, Any], args: list[Any]) -> Any:
    """What the wrapper runs: ``wrapped``, else the first argument."""
    return item.get("wrapped") or (args[0] if args else None)


def display_class(item: dict[str, Any], args: list[Any]) -> str | None:
    wrapped = job_class(item, args)
    if wrapped in (DELIVERY_JOB, MAIL_DELIVERY_JOB):
        inner = _inner_arguments(args)
        if len(inner) >= 2:
            return f"{inner[0]}#{inner[1]}"
    return wrapped if isinstance(wrapped, str) else None


def display_args(item: dict[str, Any], args: list[Any]) -> list[Any]:
    if not item.get("wrapped"):
        return []
    shown = [deserialize(value) for value in _inner_arguments(args)]
    wrapped = job_class(item, args)
    if wrapped == DELIVERY_JOB:
        return shown[3:]
    if wrapped == MAIL_DELIVERY_JOB:
        rest = shown[3:]
        delivery = rest[0] if rest and isinstance(rest[0], dict) else {}
        return [delivery.get("params"), delivery.get("args")]
    return shown


def deserialize(argument: Any) -> Any:
    """ActiveJob's serialized form as a person reads it (no record lookups)."""
    if isinstance(argument, list):
        return [deserialize(value) for value in argument]
    if isinstance(argument, dict):
        if len(argument) == 1 and GLOBALID_KEY in argument:
            return argument[GLOBALID_KEY]
        return {key: deserialize(value) for key, value in argument.items()
                if not (isinstance(key, str) and key.startswith(ACTIVE_JOB_PREFIX))}
    return argument


def _inner_arguments(args: list[Any]) -> list[Any]:
    first = args[0] if args else None
    inner = first.get("arguments") if isinstance(first, dict) else None
    return inner if isinstance(inner, list) else []

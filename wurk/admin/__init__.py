"""The ``wurk`` admin commands: read and steer a cluster from a shell.

``wurk stats``, ``queues``, ``processes``, ``workers``, ``swarms``;
``wurk retries|dead|scheduled [list|retry|delete|clear]``; ``wurk cancel JID``; ``wurk pause``,
``unpause``, ``quiet``, ``stop``, ``restart``, ``dump``; ``wurk profile
[list|show|save]``; ``wurk spool [list|push|discard]``; ``wurk limiters
[list|reset]``. Every command is
a thin layer over ``wurk.api`` (``spool`` over ``wurk.push.spool``): it builds
one JSON-able payload, printed as is with ``--json`` (shapes
documented in docs/reference/admin-cli.md, and stable) or rendered as aligned plain
text otherwise.

Duties:
1. :data:`REGISTRY`: the subcommands ``wurk`` offers next to ``run``, which
   ``wurk.cli`` installs with :func:`add_commands`.
2. :func:`run`: load the config (``-C``, ``REDIS_URL``/``WURK_*``,
   ``--redis-url``), run the command, and turn every failure into one line
   on stderr and an exit status:

   ==  =============================================================
   0   done
   1   unknown queue, identity or jid; a refused or lost command;
       Redis unreachable or answering with an error
   2   arguments that do not make sense (argparse's own status)
   78  a bad config file or setting (EX_CONFIG)
   ==  =============================================================

Modules: ``registry`` (commands as data, the context they run with),
``output`` (tables and times), ``overview`` (the read-only commands),
``jobsets`` (the three sorted sets), ``control`` (pause and signals),
``profiles`` (job profiles), ``spool`` (pushes spooled at exit),
``limiters`` (rate and concurrency limiters), ``unique`` (the locks of
unique jobs), ``batches`` (batches and their failures), ``workflows``
(workflows and their steps), ``cancel`` (one job by jid).

Adding a command: write ``wurk/admin/<name>.py``
with a ``COMMANDS`` tuple of :class:`AdminCommand` (name, help, a
``run(ctx, args)`` that calls ``ctx.emit(payload, render)``, and an
``arguments(parser)`` hook), add it to :data:`REGISTRY` below and document
its JSON in docs/reference/admin-cli.md. The global options, config loading, error
handling and exit statuses come with the registry.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, TextIO

import redis.exceptions as rx

from wurk.admin import (
    batches,
    cancel,
    control,
    jobsets,
    limiters,
    overview,
    periodic,
    profiles,
    spool,
    unique,
    workflows,
)
from wurk.admin.registry import (
    AdminCommand,
    CommandError,
    Context,
    Registry,
    UsageError,
    global_options,
)
from wurk.api import JobNotFoundError, ProcessControlError, UnknownProcessError, UnknownQueueError
from wurk.core import logging as wlog
from wurk.core.arguments import one_line
from wurk.core.redaction import redact_text, redact_url
from wurk.redis.runtime import close_runtime
from wurk.settings.config import Config, ConfigError

EX_FAILED = 1
EX_USAGE = 2
EX_CONFIG = 78
# An operator at a prompt wants an answer in a second, not a worker's retry
# schedule: one replay after a blip, then the error.
MAX_ATTEMPTS = 2

REGISTRY = Registry(*overview.COMMANDS, *jobsets.COMMANDS, *control.COMMANDS,
                    *profiles.COMMANDS, *spool.COMMANDS, *periodic.COMMANDS,
                    *limiters.COMMANDS, *unique.COMMANDS, *batches.COMMANDS,
                    *workflows.COMMANDS, *cancel.COMMANDS)

# Failures that name what was missing or refused; their message is the whole story.
NAMED_FAILURES = (CommandError, UnknownQueueError, UnknownProcessError, JobNotFoundError,
                  ProcessControlError)

__all__ = ["EX_CONFIG", "EX_FAILED", "EX_USAGE", "REGISTRY", "AdminCommand", "CommandError",
           "Context", "Registry", "UsageError", "add_commands", "add_global_options", "run"]


def add_commands(subparsers: Any) -> None:
    REGISTRY.install(subparsers)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The global options before the command name (``wurk --json stats``)."""
    global_options(parser, prefix="global_")


def option(args: argparse.Namespace, name: str) -> Any:
    """A global option given after the command name, else before it."""
    return getattr(args, name, None) or getattr(args, f"global_{name}", None)


def run(args: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Run the admin command ``args`` was parsed for; returns the exit status."""
    command: AdminCommand = args.admin_command
    try:
        config = Config.load(option(args, "config"), redis_url=option(args, "redis_url"))
    except ConfigError as exc:
        print(one_line(f"wurk: {exc}"), file=err or sys.stderr)
        return EX_CONFIG
    config = dataclasses.replace(
        config, redis_retry_attempts=min(config.redis_retry_attempts, MAX_ATTEMPTS))
    # Only errors, on stderr: stdout carries the command's output alone.
    wlog.setup("error", config.log_format)
    ctx = Context(config, json=bool(option(args, "json")), out=out, err=err)
    try:
        return command.run(ctx, args) or 0
    except (UsageError, *NAMED_FAILURES, rx.RedisError) as exc:
        status, message = failure(exc, config)
        message = one_line(redact_text(message))
        print(f"wurk {command.name}: {message}" if status == EX_USAGE else f"wurk: {message}",
              file=err or sys.stderr)
        return status
    finally:
        close_runtime(config)


def failure(exc: Exception, config: Config) -> tuple[int, str]:
    """The exit status and one-line message for a failed command."""
    if isinstance(exc, UsageError):
        return EX_USAGE, str(exc)
    if isinstance(exc, rx.ConnectionError | rx.TimeoutError):
        reason = exc.__cause__ or exc
        return EX_FAILED, f"cannot reach Redis at {redact_url(config.redis_url)}: {reason}"
    if isinstance(exc, rx.RedisError):
        return EX_FAILED, f"Redis at {redact_url(config.redis_url)} answered: {exc}"
    return EX_FAILED, str(exc)


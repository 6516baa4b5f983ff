"""The ``wurk`` command: ``wurk run`` starts one worker process.

``wurk run -r myapp.jobs -q critical:3 -q default -c 10``

The admin commands next to it (``wurk stats``, ``wurk quiet``, ...) come
from the registry in ``wurk.admin``; this module only installs and
dispatches them.

The main thread only reads signal numbers from a wakeup pipe
(``wurk.runtime.signals``); the work happens outside the handlers. Before it
starts, ``wurk run`` waits for Redis to answer (backoff up to 10 s, one
``redis.unreachable`` line per attempt). What each signal does and every
exit status are in docs/reference/signals-and-exit-codes.md, the one table
of both (a test compares it with ``HANDLED_SIGNALS`` and the ``EX_*``
constants).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

from wurk import admin
from wurk.core import logging as wlog
from wurk.core.arguments import Parser, number, one_line, usage_error, word
from wurk.core.redaction import redact_text
from wurk.redis.runtime import runtime_for
from wurk.redis.wait import wait_or_signal
from wurk.runtime.launcher import Launcher, stop_before_exit, waiting_signals, worker_signals
from wurk.runtime.loading import NoJobsError, load_modules, require_jobs
from wurk.runtime.signals import SignalPipe, dispatch, serve
from wurk.settings.config import Config, ConfigError, configure, installed_for
from wurk.settings.flags import add_setting_flags, flag_values
from wurk.version import __version__

EX_SOFTWARE = 70
# A job overran its hard_timeout: the process stopped so a fresh one takes over
# (EX_TEMPFAIL: the process manager should start it again).
EX_OVERRAN = 75
# It ran its max_jobs: the process stopped so that a fresh one takes over.
EX_RECYCLED = 75
WEB_PORT = 7433
EX_CONFIG = 78

# TERM and INT both stop ``wurk run`` (a swarm child ignores INT: its parent decides).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HANDLED_SIGNALS = (*STOP_SIGNALS, signal.SIGTSTP, signal.SIGTTIN)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="wurk", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"wurk {__version__}")
    admin.add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a worker process")
    run.add_argument("-C", "--config", help="TOML file with a [wurk] table")
    # The rest set settings: wurk.settings.declared declares each one's option.
    add_setting_flags(run)
    admin.add_commands(sub)
    _web_arguments(sub.add_parser("web", help="serve the web dashboard (needs wurk[web])"))
    return parser


def _web_arguments(parser: argparse.ArgumentParser) -> None:
    # Declared here so `wurk --help` never imports wurk.web (wurk[web] is optional).
    parser.add_argument("--redis-url", metavar="URL",
                        help="Redis to show (default: the config's, REDIS_URL, or localhost)")
    parser.add_argument("-C", "--config", metavar="FILE",
                        help="TOML file with a [wurk] table, as wurk run reads")
    parser.add_argument("--port", type=number(int, 0, 65535), default=WEB_PORT,
                        help=f"port to listen on (default {WEB_PORT}; 0 picks a free one)")
    parser.add_argument("--bind", type=word("a host name or address"), default="127.0.0.1",
                        metavar="HOST",
                        help="address to listen on (default 127.0.0.1, this machine only); "
                             "the dashboard answers the loopback names and this address, "
                             "so with 0.0.0.0 or :: remote access needs --allowed-host or "
                             "web_allowed_hosts")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                        help="one more Host name to answer (example.com, .example.com for "
                             "it and its subdomains, *.example.com, or * for any host: no "
                             "DNS-rebinding protection); repeatable, added to "
                             "web_allowed_hosts; any other Host gets 400")
    parser.add_argument("--read-only", action="store_true",
                        help="show everything, change nothing: no buttons, every POST refused")
    parser.add_argument("--poll", type=number(float, 1, 3600), default=5.0, metavar="SECONDS",
                        help="how often the dashboard's live graph polls (default 5)")


def run_web(args: argparse.Namespace) -> int:
    try:
        config = Config.load(admin.option(args, "config"),
                             redis_url=admin.option(args, "redis_url"))
    except ConfigError as exc:
        print(one_line(f"wurk: {exc}"), file=sys.stderr)
        return EX_CONFIG
    wlog.setup("warning", config.log_format)
    from wurk.web import MissingExtraError  # noqa: PLC0415 - only `wurk web` needs it
    from wurk.web.server import serve  # noqa: PLC0415 - wurk[web] is optional

    try:
        return serve(config, args)
    except MissingExtraError as exc:
        print(one_line(f"wurk web: {exc}"), file=sys.stderr)
        return EX_CONFIG


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "web":
        return run_web(args)
    if args.command != "run":
        return admin.run(args)
    if args.global_json:
        usage_error("wurk run", "run has no --json: it logs JSON lines whenever stderr "
                    "is not a terminal (log_format)")
    # -C and --redis-url work before 'run' as well as after it; given both
    # ways with different values, neither silently wins.
    config_path = _one_of("-C/--config", args.config, args.global_config)
    overrides = flag_values(args)
    overrides["redis_url"] = _one_of("--redis-url", overrides["redis_url"],
                                     args.global_redis_url)
    try:
        config = Config.load(config_path, **overrides)
    except ConfigError as exc:
        print(one_line(f"wurk: {exc}"), file=sys.stderr)
        return EX_CONFIG
    config = configure(config)  # an integration may have added a hook
    wlog.setup(config.log_level, config.log_format)
    try:
        load_modules(config.require)
    except ImportError as exc:
        print(one_line(redact_text(f"wurk: cannot load jobs: {exc}")), file=sys.stderr)
        return EX_CONFIG
    return run_worker(config)


def _one_of(flag: str, after: str | None, before: str | None) -> str | None:
    if after is not None and before is not None and after != before:
        usage_error("wurk run", f"{flag} given before and after 'run' with different values")
    return after if after is not None else before


def run_worker(config: Config) -> int:
    """Run one worker until a stop (``wurk run``, ``manage.py wurk run``); its exit status."""
    try:
        # Before Redis is waited for: with no job of its own a worker would
        # fetch every job of its queues only to fail each one as unknown.
        require_jobs()
    except NoJobsError:
        return EX_CONFIG  # require_jobs logged launcher.no_jobs with the hint
    # A module loaded since configure() may have had a callback's copy installed.
    config = installed_for(config)
    runtime = runtime_for(config)  # this worker's pools, handed to all it starts
    with SignalPipe(HANDLED_SIGNALS) as signals:
        quiet: list[bool] = []
        waiting = waiting_signals(quiet, STOP_SIGNALS)
        try:
            if not wait_or_signal(runtime.pool, signals.reader, signals.writer,
                                  lambda n: dispatch(waiting, n) is not None):
                return 0
        except Exception as exc:  # noqa: BLE001 - a refusal waiting cannot fix
            _log_boot_failure(exc)
            return EX_SOFTWARE
        launcher = Launcher(config, on_stop_request=lambda: signals.poke(signal.SIGTERM),
                            periodic=True, runtime=runtime)
        try:
            launcher.start()
        except Exception as exc:  # noqa: BLE001 - report a boot failure plainly
            _log_boot_failure(exc)
            launcher.stop(time.monotonic())
            return EX_SOFTWARE
        if quiet:
            launcher.quiet()
        return serve(signals, worker_signals(launcher, lambda: _stop(launcher), STOP_SIGNALS))


def _log_boot_failure(exc: Exception) -> None:
    wlog.get_logger("wurk.cli").error("boot.failed", error=f"{type(exc).__name__}: {exc}")


def _stop(launcher: Launcher) -> int:
    stop_before_exit(launcher)
    if launcher.overran.is_set():
        return EX_OVERRAN
    return EX_RECYCLED if launcher.recycled is not None else 0


if __name__ == "__main__":
    sys.exit(main())

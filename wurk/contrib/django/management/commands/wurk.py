"""``manage.py wurk run ...`` and ``manage.py wurk swarm --topology FILE``.

Duties:
1. ``run``: one worker process, with every flag of ``wurk run``; settings
   from the environment, then ``settings.WURK``, then the flags. Django is
   already set up and each app's ``jobs`` module imported.
2. ``swarm``: a supervised swarm from a topology file whose ``[wurk]`` table
   is read over ``settings.WURK`` (``--check`` validates and exits). Django
   is booted once, here, in the parent; every child is forked from it.
3. Close this thread's database connections before either starts: the
   swarm forks (a child must inherit none), and a worker's threads open
   their own.
4. Exit as ``wurk run`` and ``wurk-swarm`` do: 78 for a bad setting or
   topology, else the worker's or swarm's own status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from supervisor import cli as swarm_cli
from supervisor.swarm import Swarm
from supervisor.topology import TopologyError, load
from wurk import cli as wurk_cli
from wurk.contrib.django import conf
from wurk.core import logging as wlog
from wurk.core.redaction import redact_text
from wurk.runtime.loading import load_modules
from wurk.settings.config import ConfigError, configure
from wurk.settings.flags import add_setting_flags, flag_values


class Command(BaseCommand):
    help = "Run wurk workers: 'wurk run [options]' or 'wurk swarm --topology FILE'."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="wurk_command", required=True)
        run = sub.add_parser("run", help="run one worker process (the flags of 'wurk run')")
        add_setting_flags(run)
        swarm = sub.add_parser("swarm", help="run a supervised swarm of worker processes")
        swarm.add_argument("-t", "--topology", required=True, help="the topology TOML file")
        swarm.add_argument("--check", action="store_true",
                           help="validate the topology over settings.WURK and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        code = self._run(options) if options["wurk_command"] == "run" else self._swarm(options)
        if code:
            sys.exit(code)

    def _run(self, options: dict[str, Any]) -> int:
        try:
            config = conf.build_config(**flag_values(argparse.Namespace(**options)))
        except ConfigError as exc:
            raise CommandError(str(exc), returncode=wurk_cli.EX_CONFIG) from None
        config = configure(config)
        wlog.setup(config.log_level, config.log_format)
        try:
            load_modules(config.require)
        except ImportError as exc:
            raise CommandError(redact_text(f"cannot load jobs: {exc}"),
                               returncode=wurk_cli.EX_CONFIG) from None
        connections.close_all()
        return wurk_cli.run_worker(config)

    def _swarm(self, options: dict[str, Any]) -> int:
        try:
            topology = load(options["topology"], defaults=conf.values(),
                            defaults_source=conf.SOURCE)
        except (TopologyError, ConfigError) as exc:
            raise CommandError(str(exc), returncode=swarm_cli.EX_CONFIG) from None
        if options["check"]:
            self.stdout.write(f"{options['topology']} is valid over settings.WURK "
                              f"({sum(s.count for s in topology.slots)} children)")
            return 0
        wlog.setup(topology.base.log_level, topology.base.log_format)
        connections.close_all()
        return swarm_cli.run(Swarm(topology))

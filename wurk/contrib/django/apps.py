"""The Django app ``wurk.contrib.django``: what happens when Django starts.

Duties, in :meth:`WurkConfig.ready`:
1. Register the fork hooks (:mod:`.connections`) and the config hook
   (:func:`.conf.add_hooks`, through ``when_configured``).
2. Install the config built from ``settings.WURK`` as the process's default,
   unless a wurk entry point already chose one (:mod:`.boot`).
3. Import each installed app's ``jobs`` module, so its jobs register (an
   app without one is skipped; an error inside one is raised, naming it).
"""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from wurk.contrib.django import conf, connections
from wurk.settings.config import configure, when_configured

JOBS_MODULE = "jobs"
# Set by wurk.contrib.django.boot: wurk's own entry point owns the config.
entry_point_owns_config: list[bool] = []
# The config hook is registered once per process, however often start() runs.
_started: list[bool] = []


class WurkConfig(AppConfig):
    name = "wurk.contrib.django"
    label = "wurk"
    verbose_name = "wurk background jobs"

    def ready(self) -> None:
        start()


def start() -> None:
    """Everything ``ready`` does (also called by :mod:`.boot` when the app is
    not in ``INSTALLED_APPS``). Safe to call twice."""
    connections.install_fork_hooks()
    # A bad WURK_ON_COMMIT or hook fails here, at start, not in a forked child.
    conf.on_commit_alias()
    conf.hooks()
    if not _started:
        when_configured(conf.add_hooks)
        _started.append(True)
    if not entry_point_owns_config:
        configure(conf.build_config())
    autodiscover_modules(JOBS_MODULE)

"""Boot Django inside one of wurk's own entry points, once, before any fork.

``wurk-swarm`` imports its topology's ``require`` modules in the parent
before it forks (and ``wurk run`` before it starts), so naming this module
there is how a swarm runs a Django project without knowing Django::

    DJANGO_SETTINGS_MODULE=mysite.settings wurk-swarm -t swarm.toml
    # swarm.toml: [wurk] require = ["wurk.contrib.django.boot"]

Duties:
1. Refuse clearly when ``DJANGO_SETTINGS_MODULE`` is not set.
2. Leave the config to the entry point (the topology, ``wurk run``'s flags):
   settings.WURK's hooks still join it, its values do not (``manage.py wurk
   swarm`` reads them under the topology's ``[wurk]``).
3. ``django.setup()``: the app's ``ready`` finds each app's ``jobs`` module
   and registers the fork hooks; if ``wurk.contrib.django`` is not in
   ``INSTALLED_APPS``, do the same here.
"""

from __future__ import annotations

import os

import django
from django.apps import apps as django_apps

from wurk.contrib.django import apps

if not os.environ.get("DJANGO_SETTINGS_MODULE"):
    raise ImportError("wurk.contrib.django.boot needs DJANGO_SETTINGS_MODULE set to your "
                      "project's settings module (e.g. mysite.settings)")

if not apps.entry_point_owns_config:
    apps.entry_point_owns_config.append(True)
django.setup()
if not django_apps.is_installed("wurk.contrib.django"):
    apps.start()

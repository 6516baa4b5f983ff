"""Django integration: add ``"wurk.contrib.django"`` to ``INSTALLED_APPS``.

Duties, one module each:
1. :mod:`.conf`: the process's default config from ``settings.WURK`` (every
   wurk setting, checked as a TOML file's would be, errors naming
   ``settings.WURK``), its hooks given to every config a worker installs.
2. :mod:`.apps`: at start, install that config and import each installed
   app's ``jobs`` module, as Celery finds ``tasks.py``.
3. :mod:`.connections`: database safety across fork (close before, forget
   inherited ones after) and around each job (``close_old_connections``).
4. :mod:`.transactions`: pushes made inside ``transaction.atomic`` wait for
   the commit (the default) and return their jid at once.
5. ``manage.py wurk run ...`` and ``manage.py wurk swarm --topology FILE``
   (:mod:`.management.commands.wurk`), and :mod:`.boot` for wurk's own entry
   points (``require = ["wurk.contrib.django.boot"]``).
"""

from __future__ import annotations

from typing import Any

try:
    import django  # noqa: F401 - only to fail early, naming the extra
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("wurk.contrib.django needs Django: pip install 'wurk[django]'") from exc

__all__ = ["enqueue_on_commit", "on_commit"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: Django imports this package before its settings are ready.
    if name in __all__:
        from wurk.contrib.django import transactions  # noqa: PLC0415

        return getattr(transactions, name)
    raise AttributeError(f"module 'wurk.contrib.django' has no attribute {name!r}")

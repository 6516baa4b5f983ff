"""The ``wurk run`` options that set a setting, built from its declaration.

Duties:
1. :func:`add_setting_flags`: one argparse option per setting that declares a
   :class:`wurk.settings.declaration.Flag`, storing under the setting's name
   with the declared type (a list setting's option repeats).
2. :func:`flag_values`: the values those options were given, as keyword
   arguments for :meth:`wurk.settings.config.Config.load` (None where not given).
"""

from __future__ import annotations

import argparse
from typing import Any

from wurk.settings.declaration import Setting
from wurk.settings.declared import SETTINGS


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for setting in SETTINGS:
        if setting.flag is None:
            continue
        flag = setting.flag
        long_name = next(n for n in flag.names if n.startswith("--"))
        text = flag.help.format(default=setting.default, choices=", ".join(setting.choices))
        parser.add_argument(*flag.names, dest=setting.name, help=text,
                            metavar=flag.metavar or long_name[2:].replace("-", "_").upper(),
                            **_kind(setting))


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    return {s.name: getattr(args, s.name) for s in SETTINGS if s.flag is not None}


def _kind(setting: Setting) -> dict[str, Any]:
    types = setting.types
    if list in types:
        # Not given stays None, so the file's or the environment's list is kept.
        return {"action": "append", "default": None}
    if float in types:
        return {"type": float}
    if int in types:
        return {"type": int}
    if str in types:
        return {}
    raise TypeError(f"no command-line form for {setting.name} ({setting.annotation})")

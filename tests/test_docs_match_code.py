"""The documented signals, exit statuses and settings are the code's own.

Tables written by hand drift (issue #12 found the README saying both 3 and
69 for one exit status); these tests read README.md, docs/admin-cli.md and
docs/reference/settings.md and compare them with the constants the code acts on.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from pathlib import Path

from supervisor import cli as swarm_cli
from supervisor.child_boot import EX_BOOT
from supervisor.swarm import EX_KILLED
from wurk import admin
from wurk import cli as wurk_cli
from wurk.settings.config import Config, settable_fields

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
ADMIN_DOC = (ROOT / "docs" / "admin-cli.md").read_text(encoding="utf-8")
SETTINGS_DOC = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")


def table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``marker``."""
    start = text.index(marker)
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # past the header and its rule


def signal_names(cell: str) -> set[str]:
    return set(re.findall(r"`([A-Z0-9]+)`", cell))


def statuses(paragraph_start: str) -> set[int]:
    start = README.index(paragraph_start)
    paragraph = README[start:README.index("\n\n", start)]
    return {int(n) for n in re.findall(r"(?<![\w.])(\d+)(?=\s(?:after|when|for|if))", paragraph)}


# What each swarm command's row of the README starts with.
EFFECT = {"shutdown": "drain", "quiet": "quiet", "restart": "rolling restart",
          "more": "one more child", "fewer": "one fewer child", "status": "log each child"}


def test_the_swarm_signal_table_is_the_parents_dispatch_table() -> None:
    rows = table_after(README, "`wurk-swarm` (the parent):")
    documented = {name: effect for names, effect in rows for name in signal_names(names)}
    handled = {signal.Signals(n).name.removeprefix("SIG"): c
               for n, c in swarm_cli.COMMANDS.items()}
    assert set(documented) == set(handled)
    for name, command in handled.items():
        assert documented[name].startswith(EFFECT[command]), (name, command, documented[name])


def test_the_wurk_run_signal_table_is_what_wurk_run_handles() -> None:
    rows = table_after(README, "`wurk run` handles these signals")
    documented = {name for names, _ in rows for name in signal_names(names)}
    assert documented == {s.name.removeprefix("SIG") for s in wurk_cli.HANDLED_SIGNALS}


def test_the_documented_exit_statuses_are_the_codes_constants() -> None:
    assert statuses("Exit statuses of `wurk-swarm`:") == {0, EX_KILLED, EX_BOOT,
                                                          swarm_cli.EX_CONFIG}
    assert statuses("Exit statuses of `wurk run`:") == {0, wurk_cli.EX_CONFIG,
                                                        wurk_cli.EX_SOFTWARE}
    rows = table_after(ADMIN_DOC, "## Exit status and errors")
    assert {int(status) for status, _ in rows} == {0, admin.EX_FAILED, admin.EX_USAGE,
                                                    admin.EX_CONFIG}
    assert "exit 3" not in README and "status 3 " not in README


def test_every_setting_has_a_row_in_the_configuration_table_with_its_default() -> None:
    rows = table_after(SETTINGS_DOC, "# Settings\n")
    documented = {re.sub(r"`", "", key): default for key, _kind, default, *_ in rows}
    assert set(documented) == settable_fields()
    defaults = Config(redis_url="redis://localhost:6379/0")
    for field in dataclasses.fields(Config):
        shown = documented.get(field.name)
        value = getattr(defaults, field.name)
        if shown is None or value is None or isinstance(value, list | bool):
            continue
        assert shown.strip("`\"").startswith(str(value).rstrip("0").rstrip(".")
                                             if isinstance(value, float) else str(value)), \
            (field.name, shown, value)

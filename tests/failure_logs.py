"""The logs a failed test's processes wrote, attached to its report.

A test that fails now and then on a loaded machine is only worth its failure
if the report says what its workers and swarms were doing: every test that
starts processes sends their output to ``*.log`` files under its
``tmp_path``, and the tail of each is added to the report of a failed test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

LINES, WIDTH, FILES = 40, 400, 12


def tails(item: pytest.Item) -> list[tuple[str, str]]:
    """(title, text) report sections: the last lines of the test's log files."""
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not isinstance(tmp, Path):
        return []
    sections = []
    for path in sorted(tmp.rglob("*.log"))[-FILES:]:
        try:
            lines = path.read_text(errors="replace").splitlines()[-LINES:]
        except OSError:
            continue
        text = "\n".join(line[:WIDTH] for line in lines)
        sections.append((f"last {len(lines)} lines of {path.relative_to(tmp)}", text))
    return sections

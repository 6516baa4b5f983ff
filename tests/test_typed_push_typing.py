"""The enqueue verbs are typed from the job's signature: mypy and pyright agree.

``tests/typing/push_calls.py`` holds pushes that must type-check and pushes
that must not (each marked ``# expect-error``). Both checkers run over it; the
lines each flags must be exactly the marked ones, so a verb that lost its
typing (every push accepted) fails here as surely as one that refuses a
good push.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CALLS = HERE / "typing" / "push_calls.py"
ROOT = HERE.parent
# mypy: "path:LINE: error: ..."; pyright: "path:LINE:COL - error: ...".
FLAGGED = re.compile(r"push_calls\.py:(\d+):(?:\d+ -)? error")


def marked_lines() -> set[int]:
    lines = CALLS.read_text(encoding="utf-8").splitlines()
    marked = {n for n, line in enumerate(lines, 1) if re.search(r"#\s*expect-error\s*$", line)}
    assert len(marked) > 20  # the file is read as meant
    return marked


def flagged(output: str) -> set[int]:
    return {int(m.group(1)) for m in FLAGGED.finditer(output)}


def run(command: list[str]) -> str:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          check=False)
    output = done.stdout + done.stderr
    # Exit 1 is "errors found", expected here; anything else is the tool failing.
    assert done.returncode == 1, output
    return output


@pytest.mark.timeout(300)
def test_mypy_flags_exactly_the_marked_pushes() -> None:
    output = run([sys.executable, "-m", "mypy", "--no-error-summary", str(CALLS)])
    assert flagged(output) == marked_lines(), output


@pytest.mark.timeout(300)
def test_pyright_flags_exactly_the_marked_pushes() -> None:
    output = run([sys.executable, "-m", "basedpyright", "-p",
                  str(HERE / "typing" / "pyrightconfig.json"),
                  "--pythonpath", sys.executable, str(CALLS)])
    assert flagged(output) == marked_lines(), output

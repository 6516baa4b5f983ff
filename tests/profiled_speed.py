"""Does profiled code still run at full speed after a script's prelude?

A JobTimeout left pending, or a pending one dropped with
``PyThreadState_SetAsyncExc(tid, NULL)``, leaves CPython 3.11's "async
exception pending" flag set for good; from then on 300,000 calls under
cProfile take minutes instead of a fraction of a second. A prelude (the
race under test) runs in a fresh interpreter, then those calls; the
subprocess's timeout is the verdict.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROFILED_CALLS = """

def step(n):
    return n + 1


profile = cProfile.Profile()
profile.enable()
total = 0
for i in range(300_000):
    total = step(total)
profile.disable()
print("finished", total)
"""


def assert_profiled_code_runs_after(prelude: str, tmp_path: Path, timeout: float = 30) -> None:
    script = tmp_path / "prelude_then_profiled.py"
    script.write_text("import cProfile\n" + prelude + PROFILED_CALLS)
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("finished "), done.stdout

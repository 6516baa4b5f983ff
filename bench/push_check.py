"""Push-time argument checks: the client-side cost of one push, before and after.

    python bench/push_check.py [--pushes 20000] [--rounds 5] [--tree DIR ...]

Times ``perform_async`` of a three-argument job, unannotated and annotated
with JSON types (``int, str, list[int]``), through a client whose only
middleware stops every push: the signature and type checks, building and
normalising the payload and the middleware chain are measured, the Redis round
trip (tens of microseconds, unchanged by the checks) is not; and the
check alone (``signatures.check``, the call every verb makes). Prints µs per
push, median over the rounds with the range. ``--tree DIR`` measures another
source tree too (e.g. ``git archive main | tar -x -C /tmp/main``), each
round alternating the order, for a before and after in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import wurk
from wurk.push import signatures
from wurk.settings.config import Config

ROOT = Path(__file__).resolve().parent.parent
# Runs this file with wurk from PYTHONPATH (the tree first), not the venv's
# editable install (its finder on sys.meta_path would win): its imports of
# wurk above then load that tree's.
BOOT = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
        "getattr(f, '__module__', '') + getattr(type(f), '__module__', '')]; "
        "path = sys.argv.pop(1); sys.argv[0] = path; runpy.run_path(path, run_name='__main__')")


def measure(pushes: int) -> dict[str, float]:
    def stop(job_class: str, payload: Any, queue: str, redis_: Any, call_next: Any) -> None:
        """Checked, built and normalised: stopped before any write."""

    config = Config(redis_url="redis://127.0.0.1:9/0", client_middleware=[stop])
    client = wurk.Client(config, buffered=False, drain_spool=False)

    def plain(a, b, c):  # type: ignore[no-untyped-def]
        pass

    def typed(a: int, b: str, c: list[int]) -> None:
        pass

    results = {}
    for label, fn in (("unannotated", plain), ("annotated", typed)):
        job = wurk.job(name=f"bench_{label}")(fn).set(client=client)
        for _ in range(pushes // 10):  # warm up
            job.perform_async(1, "x", [1, 2, 3])
        started = time.perf_counter()
        for _ in range(pushes):
            job.perform_async(1, "x", [1, 2, 3])
        results[label] = (time.perf_counter() - started) / pushes * 1e6
        # The check alone, as every verb makes it (the same call before and after).
        args = (1, "x", [1, 2, 3])
        started = time.perf_counter()
        for _ in range(pushes):
            signatures.check(job.name, args)
        results[f"{label} check"] = (time.perf_counter() - started) / pushes * 1e6
    return results


def run_tree(tree: Path, pushes: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", BOOT, str(Path(__file__).resolve()),
                          "--measure", str(pushes)], env=env, capture_output=True, text=True,
                         check=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", type=Path, default=[])
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    trees = [ROOT, *args.tree]
    seen: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else list(reversed(trees)):
            for label, us in run_tree(tree, args.pushes).items():
                seen.setdefault((str(tree), label), []).append(us)
    for (tree, label), values in seen.items():
        print(f"{tree:40} {label:18} {statistics.median(values):6.2f} µs/push "
              f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds)")


if __name__ == "__main__":
    main()
